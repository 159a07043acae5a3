from kvadmit.cli import main

raise SystemExit(main())
