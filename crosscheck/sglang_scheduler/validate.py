"""Keep only the generated snapshots that kvadmit accepts (a generator can make a state kvadmit rejects
as invalid, e.g. a pool smaller than two pages); run with kvadmit's venv.

    python validate.py IN.jsonl OUT.jsonl

Prints "kept N rejected M {reason: count}" to stderr.
"""

import json
import sys
from collections import Counter

from kvadmit.capacity.snapshot import build_scheduler, parse_snapshot


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    bad = Counter()
    kept = 0
    with open(sys.argv[1]) as src, open(sys.argv[2], "w") as out:
        for line in src:
            try:
                build_scheduler(parse_snapshot(json.loads(line)))
            except Exception as e:
                bad[str(e)[:70]] += 1
                continue
            out.write(line)
            kept += 1
    print("kept", kept, "rejected", sum(bad.values()), dict(bad.most_common(8)), file=sys.stderr)


if __name__ == "__main__":
    main()
