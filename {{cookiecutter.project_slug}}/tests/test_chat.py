"""Instruction tuning: make-dataset --chat (OpenAI, ShareGPT and prompt/completion records
rendered with a chat template), the answers' loss mask checked against a rendering by hand,
packing without cross-talk (the GPT and model=hf), the loss normalised by the global count of
answer tokens however a batch is split, a tiny GPT that learns to reverse a prompt, and bad
input in one line. A character-level tokenizer with a ChatML template is made here, offline."""

import json
import os
import shutil
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_training_state, free_port

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
pytest.importorskip("datasets", reason="needs the [data] extra")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402
from {{ cookiecutter.package_name }}.data import chat  # noqa: E402
from {{ cookiecutter.package_name }}.data.batches import SampleStream  # noqa: E402
from {{ cookiecutter.package_name }}.data.directory import DatasetError  # noqa: E402
from {{ cookiecutter.package_name }}.make_dataset.chat import write_chat_dataset  # noqa: E402
from {{ cookiecutter.package_name }}.models import gpt, hf  # noqa: E402
from {{ cookiecutter.package_name }}.models.spec import LANGUAGE_MODEL  # noqa: E402
from {{ cookiecutter.package_name }}.parallel import RankZeroBuffers  # noqa: E402
from {{ cookiecutter.package_name }}.telemetry.metrics import read_records  # noqa: E402
from {{ cookiecutter.package_name }}.training.step import train_step  # noqa: E402

# ChatML, the chat template of Qwen2's tokenizers, in short; written with [ ] for Jinja's { }
# (a generated file holds no Jinja delimiters: the template repository renders this one)
CHATML = (
    "[% for m in messages %][[ '<|im_start|>' + m.role + '\\n' + m.content + "
    "'<|im_end|>\\n' ]][% endfor %][% if add_generation_prompt %]"
    "[[ '<|im_start|>assistant\\n' ]][% endif %]"
).translate(str.maketrans("[]", "{}"))


def char_tokenizer(path: Path, template: str | None = CHATML) -> Path:
    """One id per byte (a BPE without merges: a text's ids are its pieces' ids laid end to end),
    plus <|im_end|> (the eos token) and <|im_start|>; saved as a tokenizer directory."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    inner = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    inner.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=inner,
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=template,
    )
    fast.save_pretrained(path)
    return path


def by_hand(tokenizer, turns: list[dict]) -> tuple[list[int], list[int]]:
    """ChatML written out here, piece by piece: (ids, 1 for each of the answers' tokens)."""
    ids, mask = [], []
    for turn in turns:
        head = tokenizer.encode(f"<|im_start|>{turn['role']}\n", add_special_tokens=False).ids
        body = tokenizer.encode(f"{turn['content']}<|im_end|>\n", add_special_tokens=False).ids
        ids += head + body
        mask += [0] * len(head) + [int(turn["role"] == "assistant")] * len(body)
    return ids, mask


def conversations(n: int = 40) -> list[list[dict]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        turns = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        for t in range(1 + i % 2):
            turns.append(
                {"role": "user", "content": f"Frage {i}.{t}: " + "x" * int(rng.integers(1, 9))}
            )
            turns.append({"role": "assistant", "content": f"Grüezi ☃ {i}.{t}"})
        out.append(turns)
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def stored(directory: Path, split: str = "train") -> list[tuple[np.ndarray, np.ndarray]]:
    index = json.loads((directory / "index.json").read_text())
    files = index[split]["files"]
    tokens = np.fromfile(directory / files["tokens"]["name"], dtype=index["dtype"])
    mask = np.fromfile(directory / files["mask"]["name"], dtype=np.uint8)
    lengths = np.fromfile(directory / files["lengths"]["name"], dtype="<u4")
    ends = np.cumsum(lengths)
    return [(tokens[e - n : e], mask[e - n : e]) for e, n in zip(ends, lengths, strict=True)]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return char_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def test_the_mask_selects_exactly_the_answers_in_every_record_style(tokenizer_dir, tmp_path):
    raw = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    talks = conversations()
    sharegpt_roles = {"system": "system", "user": "human", "assistant": "gpt"}
    styles = {
        "openai": [{"messages": t} for t in talks],
        "sharegpt": [
            {
                "conversations": [
                    {"from": sharegpt_roles[m["role"]], "value": m["content"]} for m in t
                ]
            }
            for t in talks
        ],
        "prompt": [{"prompt": t[-2]["content"], "completion": t[-1]["content"]} for t in talks],
    }
    for style, records in styles.items():
        source = write_jsonl(tmp_path / f"{style}.jsonl", records)
        write_chat_dataset(str(source), tokenizer_dir, tmp_path / style)
        expected = [t if style != "prompt" else t[-2:] for t in talks]
        train = [t for i, t in enumerate(expected, 1) if i % chat.VAL_EVERY]
        for (ids, mask), turns in zip(stored(tmp_path / style), train, strict=True):
            hand_ids, hand_mask = by_hand(raw, turns)
            assert ids.tolist() == [i for i in hand_ids]
            assert mask.tolist() == hand_mask, style
    # parquet (read through datasets) gives what JSONL gives
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pyarrow.Table.from_pylist(styles["openai"]), tmp_path / "c.parquet")
    write_chat_dataset(str(tmp_path / "c.parquet"), tokenizer_dir, tmp_path / "parquet")
    for name in ("train-tokens.bin", "train-mask.bin", "val-lengths.bin"):
        parquet = (tmp_path / "parquet" / name).read_bytes()
        assert parquet == (tmp_path / "openai" / name).read_bytes()
    # the same input gives the same bytes; --train-on-prompt selects every token
    write_chat_dataset(str(tmp_path / "openai.jsonl"), tokenizer_dir, tmp_path / "again")
    for name in ("train-tokens.bin", "train-mask.bin", "val-lengths.bin", "index.json"):
        again = (tmp_path / "again" / name).read_bytes()
        assert again == (tmp_path / "openai" / name).read_bytes()
    write_chat_dataset(
        str(tmp_path / "openai.jsonl"), tokenizer_dir, tmp_path / "all", train_on_prompt=True
    )
    assert all(mask.all() for _, mask in stored(tmp_path / "all"))


def test_too_long_conversations_are_truncated_or_dropped_and_counted(
    tokenizer_dir, tmp_path, capsys
):
    talks = conversations()
    source = write_jsonl(tmp_path / "c.jsonl", [{"messages": t} for t in talks])
    lengths = [
        len(by_hand(Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")), t)[0])
        for t in talks
    ]
    limit = int(np.median(lengths))
    longer = sum(n > limit for n in lengths)
    common = ["make-dataset", "--chat", str(source), "--tokenizer", str(tokenizer_dir)]
    assert (
        main(
            [
                *common,
                "--max-length",
                str(limit),
                "--too-long",
                "drop",
                "--out",
                str(tmp_path / "d"),
            ]
        )
        == 0
    )
    assert f"0 truncated, {longer} dropped, longer than {limit} tokens" in capsys.readouterr().out
    assert main([*common, "--max-length", str(limit), "--out", str(tmp_path / "t")]) == 0
    assert f"{longer} truncated, 0 dropped" in capsys.readouterr().out
    assert max(len(ids) for ids, _ in stored(tmp_path / "t")) == limit
    # a limit below every prompt: the line says why nothing is left, not "too few records"
    assert main([*common, "--max-length", "8", "--out", str(tmp_path / "none")]) == 2
    line = capsys.readouterr().err.strip()
    assert f"{len(talks)} conversations longer than --max-length 8 tokens dropped" in line
    assert "raise --max-length" in line and not (tmp_path / "none").exists()


def test_packed_windows_keep_each_conversation_alone():
    lengths = np.array([5, 4, 6, 3, 9, 2])
    assert chat.pack(lengths, 10).tolist() == [[0, 2], [2, 4], [4, 5], [5, 6]]
    tokens = np.arange(10, 19)  # two conversations of 5 and 4 tokens
    mask = np.array([0, 0, 1, 1, 1, 0, 1, 1, 1])
    inputs, targets, positions = chat.window_arrays(tokens, mask, np.array([5, 4]), 12)
    assert inputs.tolist() == [*range(10, 19), 0, 0, 0]
    assert targets.tolist() == [-100, 12, 13, 14, -100, 16, 17, 18, -100, -100, -100, -100]
    assert positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]


def batch_of(directory: Path, window: int, indices) -> dict:
    splits = chat.open_chat(directory, None, SimpleNamespace(context_length=lambda cfg: window))
    items = [splits.train[i] for i in indices]
    return {name: torch.stack([item[name] for item in items]) for name in items[0]}


@pytest.fixture(scope="module")
def dataset(tokenizer_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("chat")
    source = write_jsonl(root / "c.jsonl", [{"messages": t} for t in conversations()])
    write_chat_dataset(str(source), tokenizer_dir, root / "data")
    return root / "data"


def tiny_gpt(window: int) -> torch.nn.Module:
    """Large weights: attention far from uniform, so a glance at another conversation shows."""
    torch.manual_seed(0)
    model = gpt.GPT(gpt.gpt_config("tiny", 258, n_embd=32, block_size=window)).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model


def tiny_llama(window: int) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=258, max_position_embeddings=window,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return hf.HFCausalLM(model).eval()


@pytest.mark.parametrize("build", [tiny_gpt, tiny_llama], ids=["gpt", "hf-llama"])
def test_the_loss_is_the_answers_cross_entropy_each_conversation_seen_alone(build, dataset):
    """Each conversation run alone through the model, its answer tokens' cross entropy summed by
    hand, equals the packed batch's loss: no token saw another conversation."""
    window = 160
    model = build(window)
    batch = batch_of(dataset, window, [0, 1, 2])
    loss_sum, count = LANGUAGE_MODEL.loss(model, batch), LANGUAGE_MODEL.count(batch)
    with torch.no_grad():
        packed = model(batch["inputs"], positions=batch["positions"])
    by_hand_sum, by_hand_count, documents = 0.0, 0, 0
    for row in range(3):
        positions = batch["positions"][row]
        starts = torch.nonzero(positions == 0).flatten().tolist() + [window]
        for start, end in zip(starts[:-1], starts[1:], strict=True):
            targets = batch["targets"][row, start:end]
            if (targets == -100).all():
                continue  # the padding
            documents += 1
            with torch.no_grad():
                logits = model(batch["inputs"][row : row + 1, start:end])[0]
            torch.testing.assert_close(packed[row, start:end], logits, rtol=1e-4, atol=1e-4)
            log_p = F.log_softmax(logits.double(), -1)
            chosen = torch.nonzero(targets != -100).flatten()
            by_hand_sum -= log_p[chosen, targets[chosen]].sum().item()
            by_hand_count += len(chosen)
    assert documents > 3  # windows do pack several conversations
    assert count.item() == by_hand_count
    assert loss_sum.item() == pytest.approx(by_hand_sum, rel=1e-5)


class RankMeanSGD(torch.optim.SGD):
    """SGD on the ranks' mean gradient, as DDP averages them. (Not DDP itself: its Reducer,
    freed as a spawned rank exits, can deadlock with gloo's worker thread over the GIL.)"""

    @torch.no_grad()
    def step(self, closure=None):
        world = torch.distributed.get_world_size()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    torch.distributed.all_reduce(param.grad)
                    param.grad.div_(world)
        return super().step(closure)


def fake_run(model, accum: int):
    distributed = torch.distributed.is_initialized()
    optimizer = (RankMeanSGD if distributed else torch.optim.SGD)(model.parameters(), lr=1.0)
    return SimpleNamespace(
        cfg=SimpleNamespace(grad_accum_steps=accum, grad_clip=0.0),
        model=model,
        buffers=RankZeroBuffers(model, torch.distributed.get_world_size() if distributed else 1),
        spec=SimpleNamespace(task=LANGUAGE_MODEL),
        autocast=nullcontext,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
    )


def step_change(model, micro_batches: list[dict]) -> dict[str, torch.Tensor]:
    """Parameter change of one SGD step (lr 1: minus the gradient) over the micro-batches."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(fake_run(model, len(micro_batches)), iter(micro_batches))
    return {n: p.detach() - before[n] for n, p in model.named_parameters()}


def split(batch: dict, rows) -> dict:
    return {name: t[rows] for name, t in batch.items()}


def two_rank_step(rank: int, port: int, directory: str, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        batch = batch_of(Path(directory), 160, range(4))
        mine = [split(batch, [2 * micro + rank]) for micro in range(2)]
        change = step_change(tiny_gpt(160).train(), mine)
        if rank == 0:
            torch.save(change, out)
    finally:
        dist.destroy_process_group()


def test_the_same_gradients_for_any_split_into_ranks_and_micro_steps(dataset, tmp_path):
    """Windows hold different numbers of answer tokens: a mean per micro-batch or per rank
    would weigh them differently; the mean over the global batch's answer tokens does not."""
    batch = batch_of(dataset, 160, range(4))
    counts = (batch["targets"] != -100).sum(1)
    assert len(set(counts.tolist())) > 1
    whole = step_change(tiny_gpt(160).train(), [batch])
    four_micro = step_change(tiny_gpt(160).train(), [split(batch, [i]) for i in range(4)])
    out = tmp_path / "two-ranks.pt"
    torch.multiprocessing.spawn(
        two_rank_step, args=(free_port(), str(dataset), str(out)), nprocs=2, join=True
    )
    two_ranks = torch.load(out)
    for name, change in whole.items():
        torch.testing.assert_close(four_micro[name], change, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(two_ranks[name], change, rtol=1e-5, atol=1e-7)


def test_the_benchmark_runs_on_chat_data_against_a_bare_masked_loss_loop(
    dataset, single_process, capsys
):
    settings = [
        "device=cpu", "model=gpt", "preset=tiny", "n_embd=32", "block_size=160",
        f"dataset={dataset}", "batch_size=4", "grad_accum_steps=2", "num_workers=0",
        "cpu_threads=1", "bench_warmup=1", "bench_steps=10",
    ]  # fmt: skip
    assert main(["benchmark", *settings]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["baseline"].startswith("bare:") and "inline_ratio" not in result
    train, bare = result["blocks"]["train"], result["blocks"]["bare"]  # two rounds of 5 steps
    assert result["ratio"] == pytest.approx((train[0] / bare[0] + train[1] / bare[1]) / 2)


def test_chat_training_resumes_bit_exactly_with_loader_processes(dataset, tmp_path, single_process):
    """Packed windows come from the generic sample stream: a run continued from its step-6
    checkpoint, now with a loader process, ends bit-identical to the run that went on."""
    settings = [
        "device=cpu", "model=gpt", "preset=tiny", "n_embd=32", "block_size=160",
        f"dataset={dataset}", "batch_size=4", "max_steps=12", "checkpoint_every=6",
        "eval_every=0", "dropout=0.1", "async_checkpoint=false", "cpu_threads=1",
    ]  # fmt: skip
    reference, run_dir = tmp_path / "reference", tmp_path / "run"
    assert main(["train", *settings, "num_workers=0", f"run_dir={reference}"]) == 0
    assert main(["train", *settings, "num_workers=0", f"run_dir={run_dir}"]) == 0
    shutil.rmtree(run_dir / "checkpoints" / "step-00000012")  # as if killed after step 6
    assert main(["train", *settings, "num_workers=1", f"run_dir={run_dir}"]) == 0
    assert_same_training_state(reference, run_dir, 12)


def reversal_task(path: Path, n: int = 600) -> Path:
    rng = np.random.default_rng(1)
    records = []
    for _ in range(n):
        word = "".join(rng.choice(list("abcd"), size=3))
        records.append({"prompt": word, "completion": word[::-1]})
    return write_jsonl(path, records)


def test_a_tiny_gpt_learns_to_reverse_the_prompt(tokenizer_dir, tmp_path, single_process, capsys):
    source = reversal_task(tmp_path / "reverse.jsonl")
    data, run_dir = tmp_path / "data", tmp_path / "run"
    command = ["make-dataset", "--chat", str(source), "--tokenizer", str(tokenizer_dir)]
    assert main([*command, "--out", str(data)]) == 0
    settings = [
        "device=cpu", "model=gpt", "preset=tiny", "n_embd=64", "block_size=64",
        f"dataset={data}", "batch_size=16", "lr=0.004", "warmup_steps=10", "max_steps=120",
        "log_every=40", "eval_every=120", "eval_batches=4", "checkpoint_every=0",
        "async_checkpoint=false", "num_workers=0", "cpu_threads=2", f"run_dir={run_dir}",
    ]  # fmt: skip
    assert main(["train", *settings]) == 0
    (evaluation,) = [r for r in read_records(run_dir) if r["kind"] == "eval"]
    # Chance on the 4 letters is ln 4 = 1.39 a token; knowing the letters but not their order
    # still costs ~0.85 per answer token (3 letters, then the easy end of the turn).
    assert evaluation["eval_loss"] < 0.25, evaluation
    # tokens seen: the windows' real tokens (padding excluded), counted from the dataset's files
    # over the windows the sample stream gave: 120 steps of 16 windows
    lengths = np.fromfile(data / "train-lengths.bin", "<u4").astype(np.int64)
    per_window = [int(lengths[a:b].sum()) for a, b in chat.pack(lengths, 64)]
    read = SampleStream(len(per_window), 1234).take(0, 120 * 16)[0]  # seed: its default
    seen = sum(per_window[i] for i in read)
    (last,) = [r for r in read_records(run_dir) if r["kind"] == "train" and r["step"] == 120]
    assert last["tokens_seen"] == seen < 120 * 16 * 64  # the windows' slots: 11 % more here
    capsys.readouterr()
    assert main(["evaluate", f"run_dir={run_dir}"]) == 0
    evaluated = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluated["perplexity"] < 1.3
    assert evaluated["eval_loss"] == pytest.approx(evaluation["eval_loss"])
    # the whole split: every answer token of the validation conversations, counted as tokens
    assert evaluated["scored_tokens"] == evaluated["scoreable_tokens"] > 100
    assert main(["generate", f"run_dir={run_dir}", "--chat", "abd", "--tokens", "5",
                 "--temperature", "0"]) == 0  # fmt: skip
    shown = capsys.readouterr().out
    assert shown.startswith("<|im_start|>user\nabd<|im_end|>\n<|im_start|>assistant\n")
    # the answer stops at the end of its turn (the line's last newline is the command's)
    assert shown == "<|im_start|>user\nabd<|im_end|>\n<|im_start|>assistant\ndba<|im_end|>\n"
    # the export's tokenizer renders a chat as the dataset did: transformers' chat pipeline and
    # vLLM's chat endpoint read its template
    export = ["export", f"run_dir={run_dir}", "--format", "hf", "--out", str(tmp_path / "hf")]
    assert main(export) == 0
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    message = [{"role": "user", "content": "abd"}]
    assert exported.apply_chat_template(message, tokenize=False) == (
        transformers.AutoTokenizer.from_pretrained(tokenizer_dir).apply_chat_template(
            message, tokenize=False
        )
    )
    assert exported.eos_token == "<|im_end|>"


BAD = {
    "no-answer": ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant turn"),
    "order": (
        '{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]}',
        "roles out of order",
    ),
    "empty": (
        '{"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "a"}]}',
        "empty or non-text content",
    ),
    "broken-json": ('{"messages": [', "not a JSON line"),
    "columns": ('{"text": "hello"}', "no conversation: columns ['text']"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_conversations_are_one_line_naming_file_and_line(case, tokenizer_dir, tmp_path, capsys):
    line, expected = BAD[case]
    good = json.dumps({"prompt": "q", "completion": "a"})
    source = tmp_path / "bad.jsonl"
    source.write_text(f"{good}\n{good}\n{line}\n")
    out = tmp_path / "out"
    argv = [
        "make-dataset",
        "--chat",
        str(source),
        "--tokenizer",
        str(tokenizer_dir),
        "--out",
        str(out),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{source}:3: " in err and expected in err, err
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_a_tokenizer_without_a_chat_template_needs_one(tmp_path, capsys):
    bare = char_tokenizer(tmp_path / "bare", template=None)
    source = write_jsonl(tmp_path / "c.jsonl", [{"messages": t} for t in conversations()])
    argv = [
        "make-dataset",
        "--chat",
        str(source),
        "--tokenizer",
        str(bare),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no chat template" in err and "--chat-template" in err
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    assert main([*argv, "--chat-template", str(template)]) == 0
    with pytest.raises(DatasetError, match="longer than the model's context of 16"):
        chat.open_chat(tmp_path / "o", None, SimpleNamespace(context_length=lambda cfg: 16))
