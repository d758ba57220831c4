"""The `language` and `images` bakes (workload=language, workload=images): their README and docs
name only what the bake has (pages, commands, models, extras, make-dataset options, config keys),
and every link between its pages resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from baked_files import generated_files

# What each bake lacks, as its README and docs would name it (the hook's WORKLOAD_PARTS say which
# files it drops; these are the words that name them). Matched as whole words.
LACKS = {
    "language": [
        *("vision.md", "torchvision", "timm", "ResNet", "resnet18", "resnet50", "ViT"),
        *("ConvNeXt", "ImageFolder", "--images", "data/augmentation.py", "[vision]", "[timm]"),
        *("model=vision", "model=timm", "vision_model", "timm_model", "image_size"),
        *("train_crop", "auto_augment", "mixup", "cutmix", "#images", "images kind"),
    ],
    "images": [
        *("finetune.md", "GPT", "gpt", "gpt2", "GPT-2", "LoRA", "lora_rank", "peft", "chat"),
        *("tokenizer", "tokenizers", "tokens", "`generate`", "generate run_dir=", "transformers"),
        "train-tokenizer",
        *("--stdlib", "--text", "--tokens", "--hf", "--chat", "[hf]", "[lora]", "[data]"),
        *("[hf,lora]", "stdlib-bytes", "lm-eval", "vLLM", "model=hf", "hf_model", "preset"),
        *("n_layer", "block_size", "tiny-wide.toml", "finetune-gpt2.toml", "gpt2-124m"),
        *("vocab_size", "init_new_vocabulary"),
    ],
}


def pages(repo: Path) -> list[str]:
    return ["README.md", *sorted(f for f in generated_files(repo) if f.startswith("docs/"))]


# Every bake's page of your own programs: its examples are programs of yours (one trains a
# torchvision model), not the package's, the same in every bake.
YOUR_PROGRAMS = "docs/your-program.md"


def named(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w./-]){re.escape(word)}(?![\w-])", text) is not None


@pytest.mark.parametrize("workload", ["language", "images"])
def test_no_page_names_what_the_bake_lacks(bake, workload):
    """README and docs: no page, command, model, extra, make-dataset option or key the bake
    lacks, the config-keys table (`keys`'s output) included."""
    repo = bake(workload)
    found = set()
    for page in set(pages(repo)) - {YOUR_PROGRAMS}:
        text = (repo / page).read_text()
        found |= {(page, word) for word in LACKS[workload] if named(text, word)}
    assert not found, sorted(found)


@pytest.mark.parametrize("workload", ["language", "images"])
def test_every_link_to_a_page_resolves(bake, workload):
    """Each markdown link of the README and docs to a file of the repository names one that the
    bake holds, and its #anchor a heading of that page."""
    repo = bake(workload)
    broken = []
    for page in pages(repo):
        for target in re.findall(r"\]\(([^)\s]+)\)", (repo / page).read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https://, mailto:
            path, _, anchor = target.partition("#")
            linked = (repo / page).parent / path if path else repo / page
            if not linked.is_file():
                broken.append((page, target))
            elif anchor and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
                slugs = {re.sub(r"[^\w -]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    broken.append((page, target))
    assert not broken, broken
