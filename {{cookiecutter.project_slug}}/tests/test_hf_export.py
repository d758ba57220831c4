"""What other tools do with an export (`export --format hf`): transformers loads it without a
warning, and lm-eval-harness's use of its tokenizer works - the dataset's tokenizer directory
(special tokens, chat template, generation defaults) carries over, config.json's bos/eos/pad ids
are the tokenizer's and its dtype the tensors'. Tiny models and tokenizers made offline."""

from __future__ import annotations

import json
import logging
import warnings

import pytest
from _language import TINY_GPT

transformers = pytest.importorskip("transformers", reason="needs the [hf] extra")
tokenizers = pytest.importorskip("tokenizers", reason="needs the [data] extra")
pytest.importorskip("datasets", reason="needs the [data] extra")

from {{ cookiecutter.package_name }}.cli import main  # noqa: E402

WORDS = "alps node train token shard model batch step lustre cluster".split()
SHORT = ["max_steps=2", "checkpoint_every=2", "eval_every=0"]
# a chat template, written with [ ] for Jinja's { } (a generated file holds no Jinja delimiters)
CHAT = "[% for m in messages %]<s>[[ m.content ]]</s>[% endfor %]".translate(
    str.maketrans("[]", "{}")
)


def documents(path):
    docs = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(30)) for i in range(300)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return docs


def tokenizer_dir(path, docs):
    """A tokenizer directory as save_pretrained writes one: bos <s>, eos </s>, pad <pad>, a
    chat template, and a generation_config.json."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    bpe.train_from_iterator(docs, trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT
    fast.save_pretrained(path)
    transformers.GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0).save_pretrained(
        path
    )
    return transformers.AutoTokenizer.from_pretrained(path)


def quiet_load(out, tokenizer: bool = True):
    """The model and the tokenizer (if any) of `out` as transformers loads them, and every
    warning and log record at WARNING or above it gave on the way."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    transformers.utils.logging.warning_once.cache_clear()  # said once per process: say it again
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = transformers.AutoModelForCausalLM.from_pretrained(out)
            loaded = transformers.AutoTokenizer.from_pretrained(out) if tokenizer else None
    finally:
        logger.removeHandler(handler)
    said = [str(w.message) for w in caught] + [r.getMessage() for r in records]
    return model, loaded, said


def test_the_export_carries_the_datasets_tokenizer_as_lm_eval_uses_it(tmp_path, single_process):
    docs = documents(tmp_path / "docs.jsonl")
    source = tokenizer_dir(tmp_path / "tok", docs)
    data = tmp_path / "data"
    assert main(["make-dataset", "--hf", str(tmp_path / "docs.jsonl"), "--tokenizer",
                 str(tmp_path / "tok"), "--out", str(data)]) == 0  # fmt: skip
    assert (data / "tokenizer_config.json").is_file() and (data / "chat_template.jinja").is_file()
    run = tmp_path / "run"
    assert main([*TINY_GPT, "vocab_size=0", f"dataset={data}", *SHORT, f"run_dir={run}"]) == 0
    out = tmp_path / "out"
    assert main(["export", f"run_dir={run}", "--format", "hf", "--out", str(out)]) == 0

    model, tokenizer, said = quiet_load(out)
    assert said == []
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "float32" and "torch_dtype" not in config
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert model.generation_config.eos_token_id == 2
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert getattr(tokenizer, name) == getattr(source, name), name
    assert tokenizer.all_special_tokens == source.all_special_tokens
    assert tokenizer.chat_template == source.chat_template == CHAT
    # lm-eval-harness: the rolling log-likelihood's first token is the tokenizer's bos (else
    # eos), which it decodes; None there was its TypeError in tok_encode
    prefix = tokenizer.bos_token_id
    prefix = tokenizer.eos_token_id if prefix is None else prefix
    assert prefix is not None and tokenizer.decode([prefix]) == "<s>"
    assert tokenizer("alps node")["input_ids"] == source("alps node")["input_ids"]


def test_a_byte_level_export_has_no_special_ids_and_loads_quietly(tmp_path, single_process):
    (tmp_path / "text.txt").write_text(" ".join(WORDS) * 200)
    data = tmp_path / "data"
    assert main(["make-dataset", "--text", str(tmp_path / "text.txt"), "--out", str(data)]) == 0
    run = tmp_path / "run"
    assert main([*TINY_GPT, "vocab_size=0", f"dataset={data}", *SHORT, f"run_dir={run}"]) == 0
    out = tmp_path / "out"
    assert main(["export", f"run_dir={run}", "--format", "hf", "--out", str(out)]) == 0
    assert quiet_load(out, tokenizer=False)[2] == []
    config = json.loads((out / "config.json").read_text())
    assert [config[f"{n}_token_id"] for n in ("bos", "eos", "pad")] == [None, None, None]


def test_export_refuses_a_tokenizer_swapped_after_training(tmp_path, single_process, capsys):
    docs = documents(tmp_path / "docs.jsonl")
    tokenizer_dir(tmp_path / "tok", docs)
    data = tmp_path / "data"
    assert main(["make-dataset", "--hf", str(tmp_path / "docs.jsonl"), "--tokenizer",
                 str(tmp_path / "tok"), "--out", str(data)]) == 0  # fmt: skip
    run = tmp_path / "run"
    assert main([*TINY_GPT, "vocab_size=0", f"dataset={data}", *SHORT, f"run_dir={run}"]) == 0
    swapped = json.loads((data / "tokenizer.json").read_text())
    vocab = swapped["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[10:12]  # same size, two ids exchanged
    vocab[first], vocab[second] = vocab[second], vocab[first]
    (data / "tokenizer.json").write_text(json.dumps(swapped))
    capsys.readouterr()
    assert main(["export", f"run_dir={run}", "--format", "hf", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json: changed since the dataset was written" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
