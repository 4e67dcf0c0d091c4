"""Small datatrove steps around the stock filters: a writer for dropped documents that records why, a
minimum-length filter and a language counter."""

from __future__ import annotations

from datatrove.data import Document, DocumentsPipeline
from datatrove.io import DataFolderLike
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers import JsonlWriter
from datatrove.pipeline.writers.disk_base import DiskWriter


def _record(writer: DiskWriter, doc: Document) -> dict:
    # always write `text` (datatrove's default adapter omits empty fields, e.g. a non-HTML record's text)
    return {"text": doc.text or "", "id": doc.id, "metadata": doc.metadata}


class DropWriter(JsonlWriter):
    """Exclusion writer: JSONL.gz shards of dropped documents with `metadata.drop_step` and `drop_reason`.

    datatrove filters put their reason in `metadata.filter_reason`; it is renamed to `drop_reason`
    (`default_reason` when a step gave none).
    """

    def __init__(self, output_folder: DataFolderLike, step: str, default_reason: str = "dropped"):
        super().__init__(output_folder, compression="gzip", adapter=_record)
        self.step = step
        self.default_reason = default_reason

    def write(self, document: Document, rank: int = 0, **kwargs):
        reason = document.metadata.pop("filter_reason", None) or self.default_reason
        document.metadata["drop_step"] = self.step
        document.metadata["drop_reason"] = reason
        super().write(document, rank, **kwargs)


class MinLengthFilter(BaseFilter):
    """Drops documents whose text is shorter than `min_chars` characters (reason `too_short`)."""

    name = "📏 Min length"

    def __init__(self, min_chars: int, exclusion_writer: DiskWriter | None = None):
        super().__init__(exclusion_writer)
        self.min_chars = min_chars

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        return True if len(doc.text.strip()) >= self.min_chars else (False, "too_short")


class CountLanguages(PipelineStep):
    """Pass-through step counting documents per `metadata.language` (stats `language_<code>`)."""

    name = "🔢 Language mix"
    type = "📊 - STATS"

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for doc in data:
            self.stat_update(f"language_{doc.metadata.get('language', 'unknown')}")
            yield doc
