"""Benchmark: the transparency log (phsafe.tlog) at N entries.

Times, for N entries of about 100 bytes: appending them to a log folder (entries file and hash
file, fsynced) in batches and one at a time; a tree head, an inclusion and a consistency proof
read from the hash file; and a reader's full verification of the published folder (every entry
rehashed). Prints one JSON object; peak memory is this process's ``ru_maxrss``. The logs of a
release pipeline hold thousands of entries; 1,000,000 is the design's headroom (issue 21).

    .venv/bin/python benchmarks/bench_tlog.py --entries 1000000
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from phsafe.tlog import (
    LogDirectory,
    format_verifier_key,
    generate_keys,
    leaf_hash,
    read_published_log,
    signer_from_key,
    verifier_from_key,
    verify_consistency,
    verify_inclusion,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args()
    n, batch = args.entries, args.batch
    skey, vkey = generate_keys("bench.example/log")
    signer, verifier = signer_from_key(skey), verifier_from_key(vkey)
    entries = [b'{"kind":"SPEND","run":"bench","index":%d,"rho":"0.0012","table":"PH1","level":"STATE"}' % i
               for i in range(n)]
    result: dict[str, float | int] = {"entries": n, "batch": batch}
    with tempfile.TemporaryDirectory(prefix="phsafe-bench-tlog-") as work:
        folder = LogDirectory.create(Path(work) / "log", format_verifier_key(signer))
        start = time.perf_counter()
        for i in range(0, n, batch):
            folder.append(entries[i:i + batch])
        result["append_batched_s"] = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(100):
            folder.append([b'{"single":%d}' % i])
        result["append_one_ms"] = (time.perf_counter() - start) * 10
        start = time.perf_counter()
        folder.publish_checkpoint(folder.sign_checkpoint(signer))
        result["sign_and_publish_ms"] = (time.perf_counter() - start) * 1e3
        size = folder.size
        start = time.perf_counter()
        root = folder.log.root()
        inclusion = folder.log.inclusion_proof(n // 2)
        consistency = folder.log.consistency_proof(n // 3)
        result["root_and_two_proofs_ms"] = (time.perf_counter() - start) * 1e3
        verify_inclusion(leaf_hash(entries[n // 2]), n // 2, size, inclusion, root)
        verify_consistency(n // 3, folder.log.root(n // 3), size, root, consistency)
        folder.close()
        start = time.perf_counter()
        published = read_published_log(Path(work) / "log", verifier)
        result["read_and_verify_whole_log_s"] = time.perf_counter() - start
        assert published.checkpoint.checkpoint.size == size
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
