"""Train the models of a workflow config: `spark-submit jobs/train.py [CONFIG] [--no-tracking]`.

The same workflow as `sparkdist train CONFIG`; CONFIG defaults to jobs/configs/churn.yaml
(the make demo job: logistic regression, random forest and XGBoost on the churn sample).
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "churn.yaml"


def main(argv: list[str] | None = None) -> int:
    from sparkdist.cli import main as cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if not [a for a in argv if not a.startswith("-")]:
        argv.insert(0, str(DEFAULT_CONFIG))
    return cli(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
