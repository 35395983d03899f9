"""Operations: reading and judging what runs left in Redis (status, check, report)."""
