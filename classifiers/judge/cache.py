"""Judge answers cached in the object store, keyed by (judge model, prompt version, document hash).

Layout: `<prefix>/<model>/<prompt>/part-<time>-<uuid>.jsonl.gz`, one line per answered document. Parts are
append-only, each one object put atomically and self-validating (gzip CRC, one JSON answer per line), so the
cache is not a committed output (`infra.committed`): listing the parts is safe, concurrent or interrupted runs
never corrupt it, a damaged part is skipped (its answers are asked again), and a rerun with the same judge
and prompt asks nothing it has asked before. Transport failures are never cached (a
rerun retries them); unparseable answers are (the model would say the same again).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import re
import time
import uuid
from dataclasses import asdict, dataclass

from infra.store import ObjectStore

log = logging.getLogger(__name__)


def document_hash(text: str) -> str:
    """sha256 of the exact text the judge sees."""
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:120] or "model"


@dataclass
class CachedAnswer:
    doc_hash: str
    answer: str
    score: float | None
    method: str  # parser method: logprobs / text / failed
    digit_probs: list[float] | None
    prompt_tokens: int
    completion_tokens: int


class JudgeCache:
    """All answers of one (model, prompt version) pair; `flush()` publishes new ones as one part file."""

    def __init__(self, store: ObjectStore, prefix: str, model_id: str, prompt_id: str):
        self.store = store
        self.prefix = f"{prefix.rstrip('/')}/{_slug(model_id)}/{_slug(prompt_id)}/"
        self._answers: dict[str, CachedAnswer] = {}
        self._pending: list[CachedAnswer] = []
        self.parts_read = self.parts_skipped = 0
        self._load()

    def _load(self) -> None:
        for key in self.store.list(self.prefix):
            if not key.endswith(".jsonl.gz"):
                continue
            try:
                with gzip.open(io.BytesIO(self.store.get_bytes(key)), "rt", encoding="utf-8") as fh:
                    entries = [CachedAnswer(**json.loads(line)) for line in fh if line.strip()]
            except (OSError, EOFError, ValueError, TypeError) as exc:  # truncated/garbled: ask those again
                log.warning("judge cache part %s is damaged, skipped: %s", self.store.uri(key), exc)
                self.parts_skipped += 1
                continue
            self._answers.update((e.doc_hash, e) for e in entries)
            self.parts_read += 1
        log.info("judge cache %s: %d answers in %d parts", self.prefix, len(self._answers), self.parts_read)

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, doc_hash: str) -> CachedAnswer | None:
        return self._answers.get(doc_hash)

    def put(self, entry: CachedAnswer) -> None:
        self._answers[entry.doc_hash] = entry
        self._pending.append(entry)

    def flush(self) -> str | None:
        """Publish pending answers as a new part; returns its key (None when nothing was pending)."""
        if not self._pending:
            return None
        buf = io.BytesIO()
        with gzip.open(buf, "wt", encoding="utf-8") as fh:
            for entry in self._pending:
                fh.write(json.dumps(asdict(entry)) + "\n")
        key = f"{self.prefix}part-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.jsonl.gz"
        self.store.put_bytes(key, buf.getvalue())
        self._pending = []
        return key
