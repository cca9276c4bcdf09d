"""Tables of a run of flash-attn's tests through the adapter, from the JSON reports that
fa_compat_plugin.py writes (one per pytest process; dev/run_fa_tests.sh runs several in parallel).

    python dev/fa_compat/fa_summary.py REPORT.json [REPORT.json ...]

Report format: {"census": {key: count}, "results": [{"nodeid", "key", "outcome", "message",
"duration"}]}, where key = "function|tag,tag,...": the test function and the features of the case
(dropout, window, softcap, alibi, causal, deterministic, mqa/gqa, kvpacked, paged, and for the KV cache
append, rotary, leftpad, batch_idx), and census counts every case in the test file, run or not. Exit
status 1 when a case failed.
"""
import collections
import json
import sys

FEATURES = ("plain", "dropout", "window", "softcap", "alibi", "causal", "deterministic", "mqa", "gqa", "kvpacked",
            "paged", "append", "rotary", "leftpad", "batch_idx")
VARIANTS = ("dropout", "window", "softcap", "alibi")
MAX_LISTED_FAILURES = 40


def split_key(key):
    function, tags = key.split("|")
    tags = set(tags.split(",")) - {""}
    if not tags & set(VARIANTS):
        tags.add("plain")
    return function, tags


def error_kind(message):
    """The exception class named at the start of a pytest crash message ('AssertionError: ...')."""
    if message.startswith("assert "):
        return "AssertionError"
    head = message.split(":", 1)[0].strip()
    return head if head and " " not in head else "other"


def load(paths):
    census = collections.Counter()
    results = []
    for i, path in enumerate(paths):
        with open(path) as f:
            report = json.load(f)
        if i == 0:  # every process sees the same collection
            census.update(report["census"])
        results.extend(report["results"])
    return census, results


def table(title, rows, columns):
    print(f"\n{title}")
    names = [name for name, _ in rows]
    width = max([len(title.split()[0])] + [len(n) for n in names]) + 2
    print("".ljust(width) + "".join(c.rjust(11) for c in columns))
    for name, values in rows:
        print(name.ljust(width) + "".join(str(round(values.get(c, 0))).rjust(11) for c in columns))


def summarize(paths):
    census, results = load(paths)
    columns = ("in file", "run", "passed", "failed", "skipped", "seconds")
    by_function = collections.defaultdict(collections.Counter)
    by_feature = collections.defaultdict(collections.Counter)
    for key, count in census.items():
        function, tags = split_key(key)
        by_function[function]["in file"] += count
        for tag in tags & set(FEATURES):
            by_feature[tag]["in file"] += count
    skip_reasons = collections.Counter()
    failure_kinds = collections.Counter()
    failures = []
    total = collections.Counter()
    for r in results:
        function, tags = split_key(r["key"])
        counters = [by_function[function], total] + [by_feature[t] for t in tags & set(FEATURES)]
        for c in counters:
            c["run"] += 1
            c[r["outcome"]] += 1
            c["seconds"] += r["duration"]
        if r["outcome"] == "skipped":
            skip_reasons[r["message"]] += 1
        elif r["outcome"] == "failed":
            failure_kinds[error_kind(r["message"])] += 1
            failures.append(r)
    table("function (all cases of the file; 'run' = selected by FA_SAMPLE/-k/FA_SHARD and run)",
          sorted(by_function.items()), columns)
    table("feature (a case counts under each of its features)",
          [(f, by_feature[f]) for f in FEATURES if f in by_feature], columns)
    if skip_reasons:
        print("\nskipped, by reason:")
        for reason, n in skip_reasons.most_common():
            print(f"  {n:7d}  {reason}")
    if failures:
        print("\nfailed, by exception:")
        for kind, n in failure_kinds.most_common():
            print(f"  {n:7d}  {kind}")
        print(f"\nfailed cases (first {MAX_LISTED_FAILURES}):")
        for r in sorted(failures, key=lambda r: r["nodeid"])[:MAX_LISTED_FAILURES]:
            print(f"  {r['nodeid']}\n      {r['message'].splitlines()[0][:200] if r['message'] else ''}")
    print(f"\ntotal: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped "
          f"of {sum(census.values())} cases in the file")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(summarize(sys.argv[1:]))
