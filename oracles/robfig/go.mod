module cron-runner/oracles/robfig

go 1.26.0

require github.com/robfig/cron/v3 v3.0.1
