from blink.bench.cli import main

raise SystemExit(main())
