from runner.cli.main import main

raise SystemExit(main())
