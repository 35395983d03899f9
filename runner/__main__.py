from runner import bundle
from runner.cli.main import main

bundle.settle()
raise SystemExit(main())
