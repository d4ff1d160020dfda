from reprocube.cli import main

raise SystemExit(main())
