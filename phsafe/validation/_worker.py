"""A second process validating one input file, or some state partitions of input stored by
state: ``python -m phsafe.validation._worker``.

Started with :mod:`subprocess` rather than :mod:`multiprocessing`: a spawned multiprocessing
child re-imports the caller's ``__main__``, which runs the top level of any script that calls
:func:`~phsafe.validation.validate_inputs` without a ``__main__`` guard. Arguments arrive as a
pickle on standard input; the result is pickled into the file named there. Nothing is printed.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main() -> int:
    request = pickle.load(sys.stdin.buffer)
    from phsafe.validation import _gx
    from phsafe.validation._inputs import validate_file, validate_states

    _gx.prewarm()
    part: object
    if request["task"] == "file":
        part = validate_file(request["source"], request.get("parameters"))
    elif request["task"] == "states":
        part = validate_states(request["sources"], request["groups"], request["file_names"],
                               request["geo_parameters"])
    else:
        raise ValueError(f"unknown validation task {request['task']!r}")
    out = Path(request["result"])
    tmp = out.with_suffix(".partial")
    with open(tmp, "wb") as fh:
        pickle.dump(part, fh, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
