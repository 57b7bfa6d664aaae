"""Write the config reference from the schema: `python scripts/config_reference.py [--check] [--out FILE]`.

The page (docs/configuration.md by default) is :func:`medseg.config_reference.reference_markdown`: every key of
every entry point with its type, default and meaning, as the dataclasses of medseg/config.py define them. ``--check``
writes nothing and exits with 1 when the page differs from what the schema gives now (regenerate it after a schema
change).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from medseg.config_reference import reference_markdown
from medseg.io import atomic_write_text

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PAGE, help=f"the page to write or check (default {PAGE})")
    parser.add_argument("--check", action="store_true", help="exit with 1 when the page is stale; write nothing")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    page = reference_markdown()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.is_file() else None
        if current != page:
            print(f"{args.out} is stale: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    atomic_write_text(args.out, page)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
