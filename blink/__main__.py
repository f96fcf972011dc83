from blink.cli import main

raise SystemExit(main())
