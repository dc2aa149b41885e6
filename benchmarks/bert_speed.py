"""Side-by-side speed of a kbert (MLX) encoder and PyTorch + transformers, in one run.

Times one training step (forward, backward, clipping, AdamW) and one inference batch for the same
configuration, alternating MLX and PyTorch repetitions, and prints sequences/s, the MLX/PyTorch
ratio, and MLX's MFU against the sgemm peak measured in the MLX process.

Each framework runs in its own worker process (started once, driven over a pipe), so that each sees
the environment its users get: kbert's (its BLAS binding, glibc keeping large buffers, its CPU kernels)
and PyTorch's (its own MKL and OpenMP, default glibc), and neither's thread pools spin against the
other's. ``--same-process`` runs both in this process instead (kbert's settings then apply to PyTorch too).

    python benchmarks/bert_speed.py --size minilm --seq 128 --reps 5
    python benchmarks/bert_speed.py --size scratch --seq 32 64 128
    python benchmarks/bert_speed.py --size deberta-v3-xsmall roberta-base --seq 128 --reps 3 --steps 2
    python benchmarks/bert_speed.py --end-to-end          # also time `kbert run titanic`
    python benchmarks/bert_speed.py --isa avx2            # as on a CPU without AVX-512: both sides limited to AVX2
    python benchmarks/bert_speed.py --size minilm --lengths tweets reviews --pooling mean  # real lengths, padded per batch
    python benchmarks/bert_speed.py --device gpu --precision fp32 bf16 --size minilm bert-base deberta-v3-base \
        --seq 128 --batch 32 --infer-batch 128            # on a GPU: kbert bf16/fp32 against PyTorch fp32/autocast

``--pooling`` is kbert's pooler: "cls" (the default, as `kbert run`'s) reads the first token, so kbert's last layer
computes that token alone (models/outputs.py ``Recording(first_token=True)``; transformers computes every
token's); "mean" reads every token, so both sides do the same matmuls: ``--pooling cls mean`` shows both ratios.

``--precision bf16`` is kbert's mixed precision (pipeline/precision.py: float32 master weights, the passes in
bf16) against PyTorch's ``torch.autocast(dtype=torch.bfloat16)`` with float32 weights; ``--device gpu`` puts
MLX on its GPU (Metal or CUDA) and PyTorch on CUDA (synchronized before each timing ends).

``--lengths tweets`` times a pass over batches of the token lengths kbert gives Disaster Tweets' training rows (its
YAML's text, MiniLM-L6's tokenizer, max_length 96), ``reviews`` a synthetic long-review distribution (log-normal,
median 180 tokens, 32-512), instead of every row at ``--seq``: rows shuffled once, each batch padded to its longest
row rounded up to kbert's length bucket, as `kbert run` pads; PyTorch gets the same padded batches and masks.

Needs the test extras (torch==2.13.0, transformers).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import competition_runs  # noqa: E402  (benchmarks/competition_runs.py, beside this script)
import figures  # noqa: E402  (benchmarks/figures.py, beside this script)

# config.json-style values by size name; model_type picks the architecture on both sides (kbert's
# build_task_model, transformers' AutoModelForSequenceClassification).
DEBERTA_V3 = dict(model_type="deberta-v2", relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm",
                  share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
                  max_relative_positions=-1, layer_norm_eps=1e-7, vocab_size=128100)
SIZES = {
    "minilm": dict(model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                   intermediate_size=1536),
    "scratch": dict(model_type="bert", vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=512),
    "deberta-v3-xsmall": dict(**DEBERTA_V3, hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                              intermediate_size=1536),
    "bert-base": dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072),
    "deberta-v3-base": dict(**DEBERTA_V3, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072),
    "mpnet-base": dict(model_type="mpnet", vocab_size=30527, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, intermediate_size=3072, pad_token_id=1, layer_norm_eps=1e-5),
    "roberta-base": dict(model_type="roberta", vocab_size=50265, hidden_size=768, num_hidden_layers=12,
                         num_attention_heads=12, intermediate_size=3072, pad_token_id=1, type_vocab_size=1,
                         layer_norm_eps=1e-5),
}


# --isa avx2: every library on both sides kept to AVX2 (kbert's kernels built for x86-64-v3, OpenBLAS's Haswell
# kernels; PyTorch's ATen kernels, oneDNN and MKL), as on a CPU without AVX-512. Set before the workers start.
AVX2_ONLY = {"KBERT_CPU_ARCH": "x86-64-v3", "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
             "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def computes_first_token_alone(size: dict) -> bool:
    """Whether the architecture's last layer can compute the first token alone (a layer's ``first_token``)."""
    from kbert.models.encoders import build_encoder

    encoder, _ = build_encoder({**size, "num_hidden_layers": 1, "vocab_size": 8})
    return any(getattr(module, "first_token", False) for _, module in encoder.named_modules())


def train_flops(size: dict, batch: int, seq: int, pooling: str = "cls") -> float:
    """Matmul FLOPs of kbert's training step (forward x 3), as in the usual 6 * params * tokens estimate: with "cls"
    pooling a BERT-family last layer computes the first token alone (DeBERTa's relative-position terms are left out,
    so its MFU is a lower bound)."""
    h, i, layers = size["hidden_size"], size["intermediate_size"], size["num_hidden_layers"]

    def layer(queries: int) -> int:  # one sequence: keys and values for every token, the rest for the queries
        return 2 * (2 * h * h * seq + (2 * h * h + 2 * h * i) * queries) + 2 * 2 * queries * seq * h

    first_token_only = pooling == "cls" and computes_first_token_alone(size)
    return 3 * batch * ((layers - 1) * layer(seq) + layer(1 if first_token_only else seq))


def mlx_setup(size: dict, seq: int, compiled: bool, device: str = "cpu", precision: str = "fp32",
              pooling: str = "cls"):
    """kbert's own train step and eval forward (pipeline/train.py), as `kbert run` uses them."""
    from kbert.models import runtime

    runtime.setup()  # binds the fast BLAS before mlx.core loads
    import mlx.core as mx

    from kbert.models.task_model import build_task_model
    from kbert.pipeline.precision import DTYPES, use_device
    from kbert.pipeline.streams import cpu_streams
    from kbert.pipeline.train import AdamW, Execution, make_forward, make_train_step

    use_device(device)
    streams = cpu_streams()  # one per core on a CPU, as `kbert run` shards its batches
    values = {**size, "max_position_embeddings": max(512, seq) + 2, "add_pooling_layer": False}
    model = build_task_model(values, "binary", pooling, 0.1)
    optimizer = AdamW(learning_rate=5e-5, weight_decay=0.01)  # kbert's: one kernel pass on a CPU
    execution = Execution(compiled, DTYPES[precision], streams)
    step = make_train_step(model, optimizer, max_grad_norm=1.0, execution=execution)
    forward = make_forward(model, execution)

    def train_step(ids, mask, targets):
        loss = step(ids, mask, targets)
        mx.eval(loss, model.parameters(), optimizer.state)

    def infer(ids, mask):
        mx.eval(forward(ids, mask))

    return model, train_step, infer


def torch_setup(size: dict, seq: int, device: str = "cpu", precision: str = "fp32"):
    import contextlib

    import torch
    import transformers

    target = "cuda" if device == "gpu" else "cpu"
    values = {k: v for k, v in size.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(size["model_type"], **values, max_position_embeddings=max(512, seq) + 2,
                                               num_labels=1)
    model = transformers.AutoModelForSequenceClassification.from_config(config).to(target)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01)
    bce = torch.nn.BCEWithLogitsLoss()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = (lambda: torch.autocast(target, dtype=dtype)) if dtype else contextlib.nullcontext
    scaler = torch.amp.GradScaler(target) if precision == "fp16" else None
    sync = torch.cuda.synchronize if target == "cuda" else (lambda: None)

    def train_step(ids, mask, targets):
        model.train()
        optimizer.zero_grad()
        with autocast():
            loss = bce(model(input_ids=ids, attention_mask=mask).logits.squeeze(-1).float(), targets)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        sync()

    def infer(ids, mask):
        model.eval()
        with torch.no_grad(), autocast():
            model(input_ids=ids, attention_mask=mask)
        sync()

    return model, train_step, infer


def tweet_lengths() -> np.ndarray:
    """Token lengths of Disaster Tweets' training rows as `kbert run nlp-getting-started --encoder minilm-l6`
    tokenizes them (the bundled data)."""
    from kbert.pipeline.config import load_competition, resolve_run_config
    from kbert.pipeline.data import load_competition_data
    from kbert.pipeline.fold import load_encoder_source, make_serializer, tokenize

    config = resolve_run_config(load_competition("nlp-getting-started"), {"encoder": "minilm-l6"})
    train = load_competition_data(config.competition).train
    tokenizer = load_encoder_source(config).tokenizer
    return np.array([len(t) for t in tokenize(config, tokenizer, make_serializer(config).fit(train), train,
                                              fold=(0, 0))])


def review_lengths(rows: int = 4000) -> np.ndarray:
    """A synthetic long-review distribution: log-normal around 180 tokens, 32 to 512."""
    rng = np.random.default_rng(1)
    return np.clip(np.round(rng.lognormal(np.log(180), 0.6, rows)), 32, 512).astype(int)


LENGTHS = {"tweets": tweet_lengths, "reviews": review_lengths}


def length_plan(lengths: np.ndarray, batch: int, batches: int) -> list[np.ndarray]:
    """``batches`` batches of row lengths drawn from ``lengths`` (shuffled once, seed 0)."""
    order = np.random.default_rng(0).permutation(len(lengths))
    return [lengths[order[i * batch:(i + 1) * batch]] for i in range(batches)]


def padded(row_lengths: np.ndarray, vocab_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) of one batch padded to its longest row rounded up to kbert's default length bucket, as kbert's
    pad_batch pads (in numpy: PyTorch's worker loads no MLX)."""
    from kbert.pipeline.config import TrainConfig

    bucket = TrainConfig().length_bucket
    width = -(-int(row_lengths.max()) // bucket) * bucket
    ids = np.random.default_rng(seed).integers(5, vocab_size, (len(row_lengths), width)).astype(np.int32)
    mask = (np.arange(width)[None, :] < row_lengths[:, None]).astype(np.int32)
    return ids * mask, mask


def timed(fn, args, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        fn(*args)
    return (time.perf_counter() - started) / steps


def batches(size: dict, seq: int, batch: int, infer_batch: int):
    rng = np.random.default_rng(0)
    ids = rng.integers(5, size["vocab_size"], (batch, seq)).astype(np.int32)
    infer_ids = rng.integers(5, size["vocab_size"], (infer_batch, seq)).astype(np.int32)
    targets = rng.integers(0, 2, batch).astype(np.float32)
    return ids, infer_ids, targets


def batch_arrays(size: dict, seq: int, batch: int, infer_batch: int, lengths: str, count: int) -> tuple[list, list]:
    """(train batches, inference batches) as numpy (ids, mask[, targets]): every row ``seq`` tokens, or with
    ``lengths`` (a .npy file of row lengths, which the parent process wrote) a plan of ``count`` batches of those
    lengths, each padded as kbert pads."""
    if lengths == "fixed":
        ids, infer_ids, targets = batches(size, seq, batch, infer_batch)
        return [(ids, np.ones_like(ids), targets)], [(infer_ids, np.ones_like(infer_ids))]
    distribution = np.load(lengths)
    targets = np.random.default_rng(0).integers(0, 2, batch).astype(np.float32)
    train = [(*padded(b, size["vocab_size"], i), targets[:len(b)])
             for i, b in enumerate(length_plan(distribution, batch, count))]
    infer = [padded(b, size["vocab_size"], i) for i, b in enumerate(length_plan(distribution, infer_batch, count))]
    return train, infer


def setup(framework: str, size_name: str, seq: int, batch: int, infer_batch: int, compiled: bool,
          device: str = "cpu", precision: str = "fp32", pooling: str = "cls", lengths: str = "fixed",
          batches: int = 1):
    """(train, infer) callables taking no arguments, each a pass over its batches, warmed up (every padded width
    traced once by a compiled step)."""
    size = SIZES[size_name]
    train_batches, infer_batches = batch_arrays(size, seq, batch, infer_batch, lengths, batches)
    longest = max(ids.shape[1] for ids, *_ in train_batches + infer_batches)
    if framework == "mlx":
        import mlx.core as mx

        mx.random.seed(0)
        _, train, infer = mlx_setup(size, longest, compiled, device, precision, pooling)
        convert = mx.array
    else:
        import torch

        torch.manual_seed(0)
        _, train, infer = torch_setup(size, longest, device, precision)
        target = "cuda" if device == "gpu" else "cpu"

        def convert(a):
            return torch.tensor(a, dtype=torch.float32 if a.dtype == np.float32 else torch.long, device=target)

    train_args = [tuple(convert(a) for a in b) for b in train_batches]
    infer_args = [tuple(convert(a) for a in b) for b in infer_batches]
    for args in {a[0].shape[1]: a for a in train_args}.values():
        train(*args)
    for args in {a[0].shape[1]: a for a in infer_args}.values():
        infer(*args)

    def over(step, arguments):
        def run():
            for args in arguments:
                step(*args)
        return run

    return over(train, train_args), over(infer, infer_args)


def describe(framework: str) -> str:
    if framework == "mlx":
        from kbert.models import runtime

        runtime.setup()
        import mlx.core as mx

        from kbert.models import cpu_kernels
        from kbert.models.blas import measure_sgemm_gflops

        from kbert.pipeline.fold_processes import usable_cores

        with mx.stream(mx.cpu):
            core = measure_sgemm_gflops()  # one BLAS thread: kbert's CPU streams run one each, one per core
        peak = core * usable_cores()
        cpu_kernels.kernels()
        status = runtime.status()
        return (f"peak={peak} MLX {mx.__version__} on {mx.default_device()}, BLAS {status.blas.name}, sgemm peak "
                f"{core:.0f} GFLOP/s a core ({peak:.0f} on {usable_cores()}, the MFU's), CPU kernels "
                f"{cpu_kernels.STATUS.state}, malloc {status.malloc}")
    import torch

    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"torch {torch.__version__}, {torch.get_num_threads()} threads{gpu}"


def worker(framework: str) -> None:
    """Child process: answers the parent's commands (see Worker.ask) one line each."""
    local = Worker(framework, same_process=True)
    for line in sys.stdin:
        print(local.ask(line.strip()), flush=True)


class Worker:
    """One framework's side: a child process, or this process with --same-process."""

    def __init__(self, framework: str, same_process: bool):
        self.framework = framework
        self.proc = None if same_process else subprocess.Popen(
            [sys.executable, __file__, "--worker", framework], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd=ROOT)
        self.runners: dict[str, object] = {}
        self.counts: dict[str, int] = {}

    def ask(self, line: str) -> str:
        """`describe`, `setup SIZE SEQ BATCH INFER_BATCH COMPILED DEVICE PRECISION POOLING LENGTHS BATCHES`,
        `train STEPS` or `infer STEPS` (sequences/s; a step is a pass over the batches)."""
        if self.proc is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
            if not answer:
                raise RuntimeError(f"the {self.framework} worker died (see its stderr above)")
            return answer.strip()
        command, *rest = line.split()
        if command == "describe":
            return describe(self.framework)
        if command == "setup":
            size_name, seq, batch, infer_batch, compiled, device, precision, pooling, lengths, batches = rest
            self.runners["train"], self.runners["infer"] = setup(self.framework, size_name, int(seq), int(batch),
                                                                 int(infer_batch), compiled == "1", device, precision,
                                                                 pooling, lengths, int(batches))
            self.counts = {"train": int(batch) * int(batches), "infer": int(infer_batch) * int(batches)}
            return "ready"
        return str(self.counts[command] / timed(self.runners[command], (), int(rest[0])))

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()


def quartiles(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles (the interquartile range's ends)."""
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


def bench(workers: dict[str, Worker], size_name: str, seq: int, batch: int, infer_batch: int, reps: int,
          steps: int, peak: float, compiled: bool, device: str = "cpu", precision: str = "fp32",
          pooling: str = "cls", lengths: str = "fixed", batches: int = 1) -> dict:
    for w in workers.values():
        w.ask(f"setup {size_name} {seq} {batch} {infer_batch} {int(compiled)} {device} {precision} {pooling} "
              f"{lengths} {batches}")
    results = {"mlx_train": [], "torch_train": [], "mlx_infer": [], "torch_infer": []}
    for _ in range(reps):  # alternate, so drifting machine load hits both sides alike
        for kind in ("train", "infer"):
            for framework in ("mlx", "torch"):
                time.sleep(0.5)  # let the other side's BLAS/OpenMP threads stop spinning before timing
                results[f"{framework}_{kind}"].append(float(workers[framework].ask(f"{kind} {steps}")))
    median = {k: statistics.median(v) for k, v in results.items()}
    ratios_train = [m / t for m, t in zip(results["mlx_train"], results["torch_train"])]
    ratios_infer = [m / t for m, t in zip(results["mlx_infer"], results["torch_infer"])]
    step_flops = train_flops(SIZES[size_name], batch, seq, pooling)
    return {
        **median,
        "train_ratio": statistics.median(ratios_train),
        "infer_ratio": statistics.median(ratios_infer),
        "train_ratios": ratios_train,
        "infer_ratios": ratios_infer,
        "train_iqr": quartiles(ratios_train),
        "infer_iqr": quartiles(ratios_infer),
        "mlx_train_mfu": median["mlx_train"] / batch * step_flops / (peak * 1e9) if lengths == "fixed" else None,
    }


# What "every optimization off" means for `kbert run`: MLX's reference BLAS, glibc's default allocator
# behaviour, MLX's own softmax/GELU ops, eager steps and fixed-length padding.
UNOPTIMIZED_ENV = {"KBERT_BLAS": "reference", "KBERT_MALLOC": "default", "KBERT_CPU_KERNELS": "0"}
UNOPTIMIZED_FLAGS = ["--no-compile", "--no-dynamic-padding"]


def end_to_end(unoptimized: bool) -> float:
    """Seconds of `kbert run titanic` as benchmarks/competition_runs.py times it, optimized or not."""
    if unoptimized:
        return competition_runs.run("titanic", UNOPTIMIZED_FLAGS, UNOPTIMIZED_ENV)["seconds"]
    return competition_runs.run("titanic", [])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), nargs="+", default=["minilm", "scratch"])
    parser.add_argument("--seq", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--lengths", choices=["fixed", *LENGTHS], nargs="+", default=["fixed"],
                        help="fixed: every row --seq tokens; tweets, reviews: rows of those token lengths, each "
                             "batch padded to its longest row (--seq is then unused)")
    parser.add_argument("--batches", type=int, default=8, help="--lengths other than fixed: batches per pass")
    parser.add_argument("--batch", type=int, default=32, help="training batch size")
    parser.add_argument("--infer-batch", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5, help="alternating MLX/PyTorch repetitions")
    parser.add_argument("--steps", type=int, default=3, help="steps timed per repetition")
    parser.add_argument("--no-compile", action="store_true", help="time kbert's eager (uncompiled) steps")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                        help="gpu: MLX on its GPU (Metal or CUDA), PyTorch on CUDA")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], nargs="+", default=["fp32"],
                        help="kbert's mixed precision against PyTorch's autocast (MFU stays against the fp32 "
                             "sgemm peak)")
    parser.add_argument("--pooling", choices=["cls", "mean"], nargs="+", default=["cls"],
                        help="kbert's pooler (PyTorch: transformers' own, the first token): cls computes kbert's "
                             "last layer for the first token alone; mean for every token, as PyTorch does")
    parser.add_argument("--isa", choices=["native", "avx2"], default="native",
                        help="avx2: keep kbert's kernels, OpenBLAS and PyTorch to AVX2 (a CPU without AVX-512)")
    parser.add_argument("--end-to-end", action="store_true", help="also time `kbert run titanic` end to end")
    parser.add_argument("--end-to-end-reference", action="store_true",
                        help="also time it with every optimization off (reference BLAS, default malloc, no CPU "
                             "kernels, no compile, no dynamic padding; about an hour)")
    parser.add_argument("--same-process", action="store_true",
                        help="run MLX and PyTorch in this one process (kbert's settings then apply to both)")
    figures.add_record_option(parser)
    parser.add_argument("--worker", choices=["mlx", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return

    if args.isa == "avx2":
        os.environ.update(AVX2_ONLY)
    print(figures.header() + ("; kernels limited to AVX2 (" + " ".join(f"{k}={v}" for k, v in AVX2_ONLY.items())
                               + ")" if args.isa == "avx2" else ""))
    workers = {framework: Worker(framework, args.same_process) for framework in ("mlx", "torch")}
    mlx_line = workers["mlx"].ask("describe")
    peak = float(mlx_line.split()[0].removeprefix("peak="))
    print(mlx_line.split(" ", 1)[1] + "; " + workers["torch"].ask("describe")
          + ("; one process" if args.same_process else "; one worker process each"))
    header = f"{'size':17} {'seq':>7} {'prec':>4} {'pool':>4} | {'MLX train':>9} {'torch train':>11} {'ratio':>5} | " \
             f"{'MLX infer':>9} {'torch infer':>11} {'ratio':>5} | {'MFU':>5}"
    print(f"device: {args.device}\n" + header + "\n" + "-" * len(header))
    shapes = [(seq, "fixed") for seq in args.seq if "fixed" in args.lengths] + [
        (0, lengths) for lengths in args.lengths if lengths != "fixed"]
    folder = tempfile.TemporaryDirectory()
    rows, ratios = [], {}
    files = {"fixed": "fixed"}  # the row lengths, computed here once (the PyTorch worker loads no kbert)
    for name in set(args.lengths) - {"fixed"}:
        files[name] = str(Path(folder.name) / f"{name}.npy")
        np.save(files[name], LENGTHS[name]())
    for size, (seq, lengths), precision, pooling in itertools.product(args.size, shapes, args.precision,
                                                                       args.pooling):
        r = bench(workers, size, seq, args.batch, args.infer_batch, args.reps, args.steps, peak, not args.no_compile,
                  args.device, precision, pooling, files[lengths], args.batches if lengths != "fixed" else 1)
        mfu = f"{r['mlx_train_mfu']:5.1%}" if args.device == "cpu" and r["mlx_train_mfu"] is not None else "    -"
        print(f"{size:17} {seq if lengths == 'fixed' else lengths:>7} {precision:>4} {pooling:>4} | "
              f"{r['mlx_train']:9.1f} {r['torch_train']:11.1f} {r['train_ratio']:5.2f} | {r['mlx_infer']:9.1f} "
              f"{r['torch_infer']:11.1f} {r['infer_ratio']:5.2f} | {mfu}", flush=True)  # MFU: a CPU peak
        print(f"{'':35} ratio IQR: train {r['train_iqr'][0]:.2f}-{r['train_iqr'][1]:.2f} | infer "
              f"{r['infer_iqr'][0]:.2f}-{r['infer_iqr'][1]:.2f}; per repetition: train "
              + " ".join(f"{x:.2f}" for x in r["train_ratios"]) + " | infer "
              + " ".join(f"{x:.2f}" for x in r["infer_ratios"]), flush=True)
        shape = seq if lengths == "fixed" else lengths
        rows.append([size, shape, precision, pooling, f"{r['mlx_train']:.1f}", f"{r['torch_train']:.1f}",
                     f"{r['train_ratio']:.2f} ({r['train_iqr'][0]:.2f}-{r['train_iqr'][1]:.2f})",
                     f"{r['mlx_infer']:.1f}", f"{r['torch_infer']:.1f}",
                     f"{r['infer_ratio']:.2f} ({r['infer_iqr'][0]:.2f}-{r['infer_iqr'][1]:.2f})"])
        for kind in ("train", "infer"):  # the ratio, and kbert's sequences/s (the encoder table's speeds)
            key = f"{size}_{shape}_{precision}_{pooling}_{kind}".replace("-", "_")
            ratios[key] = [round(r[f"{kind}_ratio"], 2), "x"]
            ratios[f"{key}_speed"] = [round(r[f"mlx_{kind}"], 1), "seq/s"]
    folder.cleanup()
    for w in workers.values():
        w.close()
    print("(sequences/s; ratio = median over repetitions of MLX / PyTorch)")
    if args.record:
        columns = ["size", "seq", "precision", "pooling", "kbert train", "PyTorch train", "ratio (IQR)",
                   "kbert infer", "PyTorch infer", "ratio (IQR)"]
        figures.record(args.record, figures=ratios, tables={"speed": {"columns": columns, "rows": rows}})
    if args.end_to_end:
        print(f"kbert run titanic: {end_to_end(False):.0f}s with every optimization on", flush=True)
    if args.end_to_end_reference:
        print(f"kbert run titanic: {end_to_end(True):.0f}s with every optimization off "
              f"({' '.join(f'{k}={v}' for k, v in UNOPTIMIZED_ENV.items())} {' '.join(UNOPTIMIZED_FLAGS)})",
              flush=True)


if __name__ == "__main__":
    main()
