"""What the server test scripts (hostile.py, slots.py, perip.py, prefix_disk.py, chat_check.py)
share: a tally of passed and failed checks or cases, and the "N passed, N failed" line that
tests/server/run.sh reads. Imported from the scripts' own directory (python3 puts it on sys.path)."""
import sys
import time

_counts = {"passed": 0, "failed": 0}


def check(cond, what, prefix="FAIL"):
    """One check: counted passed when cond holds, else failed with "PREFIX what" printed."""
    if cond:
        _counts["passed"] += 1
    else:
        _counts["failed"] += 1
        print(prefix, what, flush=True)


def case(name, after=None):
    """A decorator that runs fn at once as the case `name`: it passes when fn (then after(), when
    given: what the server must still do after each case) raises nothing; fn may return a note
    for its "ok" line. Prints one line per case with its time."""
    def wrap(fn):
        t0 = time.time()
        try:
            note = fn()
            if after:
                after()
            _counts["passed"] += 1
            print(f"ok   {name} ({time.time() - t0:.1f}s){' ' + note if note else ''}", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on
            _counts["failed"] += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        return fn
    return wrap


def finish():
    """Print the tally's line and exit: status 1 when anything failed."""
    print(f"{_counts['passed']} passed, {_counts['failed']} failed")
    sys.exit(1 if _counts["failed"] else 0)
