"""LLM judge: versioned prompts, OpenAI-compatible and in-process backends, a store cache, a probe-set
quality gate. Typical use (see `judge_config.build_judge`):

    judge = build_judge(JudgeConfig(), store, "edu_math")
    gate = run_quality_gate(judge, config.gate)      # agreement with probes of known character
    scores = judge.score_texts(texts)                # JudgeScore per text; judge.metrics() for MLflow
"""

from classifiers.judge.client import JudgeClient, JudgeClientConfig, JudgeScore
from classifiers.judge.judge_config import JudgeConfig, build_backend, build_judge, prompt_name
from classifiers.judge.prompt_files import JudgePrompt, load_prompt
from classifiers.judge.quality_gate import GateConfig, GateResult, run_quality_gate

__all__ = [
    "GateConfig",
    "GateResult",
    "JudgeClient",
    "JudgeClientConfig",
    "JudgeConfig",
    "JudgePrompt",
    "JudgeScore",
    "build_backend",
    "build_judge",
    "load_prompt",
    "prompt_name",
    "run_quality_gate",
]
