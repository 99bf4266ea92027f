"""A Hugging Face `Trainer` tuned as it is: a tiny BERT, randomly initialised (no download),
classifying generated token sequences, with tuner's `TunerCallback` (docs/how-to/transformers.md).

Both forms a sweep can run it in:

- a script, `task.command` (search_spaces/hf_command.yaml):
      python search_spaces/hf_tiny.py --lr 1e-3 --epochs 3
  (it runs alone too: each epoch's metrics are printed);
- a function, `task.train: hf_tiny:train` (search_spaces/hf_train.yaml), which also keeps the
  best epoch's weights: best/, `tuner.load_best(dir, model=build_model(config))`.

The task: a sequence of 16 tokens is labelled 1 when token 3 appears in it more often than
token 4. The model sees only the tokens.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    EarlyStoppingCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from tuner.integrations.transformers import TunerCallback

VOCAB, LENGTH = 16, 16


def build_model(config: dict[str, Any]) -> BertForSequenceClassification:
    """A BERT of 2 layers, 32 wide, weights drawn from the seed (nothing downloaded)."""
    torch.manual_seed(int(config.get("seed", 0)))
    width = int(config.get("width", 32))
    return BertForSequenceClassification(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=width,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=2 * width,
            max_position_embeddings=LENGTH,
            hidden_dropout_prob=float(config.get("dropout", 0.1)),
            num_labels=2,
        )
    )


class Counting(Dataset):
    """Generated sequences: label 1 when token 3 outnumbers token 4."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(1, VOCAB, (n, LENGTH), generator=g)
        self.y = ((self.x == 3).sum(1) > (self.x == 4).sum(1)).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        mask = torch.ones(LENGTH, dtype=torch.long)
        return {"input_ids": self.x[i], "attention_mask": mask, "labels": self.y[i]}


def accuracy(prediction: Any) -> dict[str, float]:
    logits, labels = prediction
    return {"accuracy": float((np.argmax(logits, -1) == labels).mean())}


def fit(
    config: dict[str, Any], max_epochs: int, ctx: Any = None, callbacks: Sequence[TrainerCallback] = ()
) -> Trainer:
    """Train one configuration: the same code alone, in a script, or in `task.train`."""
    torch.set_num_threads(1)
    tuned = TunerCallback(ctx)
    args = TrainingArguments(
        output_dir=tuned.output_dir or "hf_tiny_out",
        num_train_epochs=max_epochs,
        learning_rate=float(config["lr"]),
        per_device_train_batch_size=32,
        per_device_eval_batch_size=128,
        eval_strategy="epoch",  # (TunerCallback: one report an epoch, with its checkpoint)
        save_strategy="epoch",
        logging_strategy="epoch",
        load_best_model_at_end=True,  # (the Trainer's early stopping needs it)
        metric_for_best_model="eval_loss",
        save_total_limit=2,
        report_to="none",
        use_cpu=True,
        seed=int(config.get("seed", 0)),
        disable_tqdm=True,
    )
    patience = int(config.get("patience", 3))
    stop = EarlyStoppingCallback(patience, float(config.get("threshold", 0.0)))
    trainer = Trainer(
        build_model(config),
        args,
        train_dataset=Counting(512, seed=1),
        eval_dataset=Counting(128, seed=2),
        compute_metrics=accuracy,
        callbacks=[stop, *callbacks, tuned],  # (tuned last: a stopped trial ends in its on_train_end)
    )
    trainer.train(resume_from_checkpoint=tuned.resume_from_checkpoint)
    return trainer


def train(config: dict[str, Any], ctx: Any) -> None:
    """`task.train: hf_tiny:train`."""
    fit(config, ctx.max_epochs, ctx)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--patience", type=int, default=3, help="the Trainer's early stopping on eval_loss")
    p.add_argument("--epochs", type=int, default=5)
    args = p.parse_args(argv)
    fit(vars(args), args.epochs)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
