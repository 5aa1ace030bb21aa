"""Totals per statement of auto_explain's JSON plans in a PostgreSQL log (bench/pg/explain.sh)."""
import collections
import json
import re
import sys

HEADER = re.compile(r"^\S+ \S+ UTC \[\d+\] \S+ LOG:  duration: ([\d.]+) ms  plan:\n", re.M)


def main(log_path: str, runs: int) -> None:
    parts = HEADER.split(open(log_path).read())
    totals = collections.defaultdict(lambda: [0, 0.0, collections.Counter()])
    for i in range(1, len(parts) - 1, 2):
        body = "\n".join(line[1:] for line in parts[i + 1].split("\n") if line.startswith("\t"))
        try:
            plan = json.loads(body)
        except ValueError:
            continue
        query = re.sub(r"\s+", " ", plan.get("Query Text", ""))[:150]
        total = totals[query]
        total[0] += 1
        total[1] += float(parts[i])
        for trigger in plan.get("Triggers", []):
            total[2][f"{trigger.get('Trigger Name')}/{trigger.get('Relation')}"] += trigger.get("Time", 0)
    overall = sum(t[1] for t in totals.values())
    print(f"{runs} runs; statements' time {overall:.0f} ms, {overall / max(runs, 1):.3f} ms per run")
    for query, (count, ms, triggers) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"{ms:8.0f} ms {count:6d}x {ms / count * 1000:7.1f} us {count / max(runs, 1):5.2f}/run  {query}")
        for name, t in triggers.most_common(4):
            print(f"          trigger {name}: {t:.0f} ms")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
