"""The usual mistakes in lessons 18 and 19's mpiexec exercises, and what their checks say.

    python tests/scripts/lesson_mistakes.py [--ranks 2]

Each case is the lesson's solution (``lessons/solutions/``) with a line or two changed: run
under ``mpiexec`` by ``18_yours.py`` / ``19_yours.py``, it must fail with one line that
names the rank and the mistake, and no traceback.  The solution itself must pass.  Prints
one line per case: the diagnostic of its first rank.  (The blank exercises are
tests/test_lesson_yours.py's; this is the longer matrix, kept out of the suite.)
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REGROUP = [("grouped = q.reshape(b, h_kv, h // h_kv, n, d)",          # group j: the heads with h % H_kv = j
            "order = np.argsort(np.arange(h) % h_kv, kind='stable'); "
            "grouped = q[:, order].reshape(b, h_kv, h // h_kv, n, d)")]

CASES = {
    ("18_tokens", "tokenize_share", "18_yours.py"): [
        ("the solution", []),
        ("every rank reads every file", [("if b * p // sizes.sum() == r]", "]")]),
        ("files shared by count, not bytes", [
            ("mine = [path for path, b in zip(paths, first) if b * p // sizes.sum() == r]",
             "mine = paths[r * len(paths) // p:(r + 1) * len(paths) // p]")]),
        ("no <|endoftext|> before a file", [("ids += [tokenizer.eot, *", "ids += [*")]),
        ("the shard written in place", [('tmp = f"{path}.tmp"', "tmp = path")]),
        ("a header one token short", [("VERSION, len(ids)", "VERSION, len(ids) - 1")]),
        ("the index in reverse rank order", [("enumerate(counts)]", "enumerate(counts[::-1])]")]),
    ],
    ("19_decoder", "cp_attention", "19_yours.py"): [
        ("the solution", []),
        ("q and k not rotated", [("q, k = my_rope(q, positions[r], base), my_rope(k, positions[r], base)", "pass")]),
        ("rotated at local rows", [("q, k = my_rope(q, positions[r], base), my_rope(k, positions[r], base)",
                                    "q, k = my_rope(q, np.arange(n), base), my_rope(k, np.arange(n), base)")]),
        ("the mask by gathered row", [("key_positions[None, :] <= positions[r][:, None]",
                                       "np.arange(cp * n)[None, :] <= np.arange(r * n, (r + 1) * n)[:, None]")]),
        ("no causal mask", [("key_positions[None, :] <= positions[r][:, None]", "True")]),
        ("query head h reads KV head h % H_kv", REGROUP + [("return out.reshape(b, h, n, d)",
                                                           "return out.reshape(b, h, n, d)[:, np.argsort(order)]")]),
        ("heads regrouped, the output left in group order", REGROUP),
        ("K/V repeated to H heads before the gather", [
            ("h_kv = k.shape[1]",
             "h_kv = h; k, v = k[:, np.arange(h) * k.shape[1] // h], v[:, np.arange(h) * k.shape[1] // h]")]),
        ("K/V repeated with np.repeat", [
            ("h_kv = k.shape[1]",
             "h_kv = h; k, v = np.repeat(k, h // k.shape[1], axis=1), np.repeat(v, h // k.shape[1], axis=1)")]),
    ],
}


def solution(lesson, name):
    path = os.path.join(REPO, "lessons", "solutions", lesson + ".py")
    spec = importlib.util.spec_from_file_location("solutions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SOLUTIONS[name].strip("\n").split("\n", 1)[1]        # without its %%writefile line


def run(script, path, ranks):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
               OMP_NUM_THREADS="1", MINIPAR_COMM_CHECK="1")
    proc = subprocess.run(["mpiexec", "-n", str(ranks), sys.executable, script, "--file", path],
                          cwd=os.path.join(REPO, "lessons"), env=env, capture_output=True, text=True, timeout=180)
    text = proc.stdout + proc.stderr
    lines = text.strip().splitlines()
    first = next((line for line in lines if line.startswith("rank ")), lines[0] if lines else
                 f"(no output at all, exit status {proc.returncode})")
    return proc.returncode, first, "Traceback" in text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    args = ap.parse_args()
    wrong = 0
    for (lesson, name, script), cases in CASES.items():
        code = solution(lesson, name)
        for what, changes in cases:
            changed = code
            for old, new in changes:
                if changed.count(old) != 1:
                    raise SystemExit(f"{lesson} {name}: the case {what!r} no longer applies to the solution")
                changed = changed.replace(old, new)
            with tempfile.TemporaryDirectory(prefix="minipar_mistake_") as folder:
                path = os.path.join(folder, f"{name}.py")
                with open(path, "w") as f:
                    f.write(changed)
                rc, line, traceback = run(script, path, args.ranks)
            ok = (rc == 0 and not changes) or (rc != 0 and changes and line.startswith("rank ") and not traceback)
            wrong += not ok
            print(f"{'ok ' if ok else 'BAD'} {lesson} {what:>42}: {line}", flush=True)
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
