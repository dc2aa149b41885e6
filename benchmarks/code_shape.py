"""The code-shape counts of issue 47 over a checkout's product code: long parameter lists, long module
docstrings, encoder flags in models/, homonym module pairs, Optuna names reached privately.

Usage: python benchmarks/code_shape.py [ROOT]  (default: this checkout). kbert/cli/<command>.py modules are
named for their command and are not counted as homonyms of the stage they call."""
import ast, re, sys, pathlib, itertools
root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
dirs = ["pipeline", "ensembles", "models", "features", "kbert", "competitions"]
files = [p for d in dirs for p in sorted((root / d).rglob("*.py"))]
long = []
every = []
docs = []
for p in files:
    tree = ast.parse(p.read_text())
    d = ast.get_docstring(tree, clean=False)
    if d and len(d.strip().splitlines()) >= 10:
        docs.append((len(d.strip().splitlines()), str(p.relative_to(root))))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
            n = len(names) + (1 if a.vararg else 0) + (1 if a.kwarg else 0)
            every.append((n, f"{p.relative_to(root)}:{node.lineno} {node.name}"))
            if n > 6 or a.kwarg:
                long.append((n, f"{p.relative_to(root)}:{node.lineno} {node.name}", "**" if a.kwarg else ""))
long.sort(reverse=True)
print("functions >6 params (or **kwargs):", len(long))
for top in ("pipeline", "ensembles"):
    print(f"  in {top}/:", sum(1 for x in long if x[1].startswith(top + "/")))
print("ten longest parameter lists:")
for n, w in sorted(every, reverse=True)[:10]:
    print(f"  {n:3d} {w}")
print("violations:", *(f"{w} ({n}{', **' if k else ''})" for n, w, k in long), sep="\n  ")
print("module docstrings >= 10 lines:", len(docs))
models = [p for p in files if p.parts[len(root.parts)] == "models"]
cnt = sum(len(re.findall(r"output_attentions|first_token_only", p.read_text())) for p in models)
print("output_attentions/first_token_only in models/:", cnt)
stems = {}
for p in files:
    stems.setdefault(p.parent, []).append(p.stem)
names = [(str(p.relative_to(root)), p.stem) for p in files if p.stem != "__init__"]
pairs = []
allstems = [(str(p.relative_to(root).with_suffix("")), p.stem.rstrip("s")) for p in files if p.stem != "__init__"]
# same stem anywhere, or stems differing by a trailing s, or a module stem equal to a package dir name
pk = {str(p.relative_to(root)): p.stem for p in files if p.stem != "__init__"}
pkgs = {d.name: str(d.relative_to(root)) for top in dirs for d in [root / top, *(root / top).rglob("*")]
        if d.is_dir() and (d / "__init__.py").exists()}
pk = {a: s for a, s in pk.items() if not a.startswith("kbert/cli/")}
for (a, sa), (b, sb) in itertools.combinations(pk.items(), 2):
    if sa.rstrip("s") == sb.rstrip("s"):
        pairs.append((a, b))
for a, sa in pk.items():
    if sa in pkgs and not a.startswith(pkgs[sa] + "/"):
        pairs.append((a, pkgs[sa] + "/"))
print("homonym pairs:", len(pairs))
for x in pairs: print("  ", x)
priv = []
for p in files:
    t = p.read_text()
    for m in re.finditer(r"optuna[\w.]*\._\w+|RDBStorage\._\w+|\"_[a-z]\w+\"", t):
        if "optuna" in t:
            priv.append(f"{p.relative_to(root)}: {m.group(0)}")
print("optuna private/string names (approx):", len(priv))
for x in priv: print("  ", x)
