from eagle_gate.cli import main

raise SystemExit(main())
