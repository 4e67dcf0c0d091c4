"""On-policy cross-stage distillation (Eq. 2): the loss on hand-built tensors (detached per-token log-ratio,
group size 1, masked tokens, the gradient is the reverse-KL gradient on a tiny categorical) and the loop on
micro models (a student distilled from a teacher taught to answer 'blue' moves toward it)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from color_task import (  # pytest puts this directory on sys.path
    SayBlue,
    color_tasks,
    color_tokenizer_and_config,
)

from training.model import build_model
from training.rl.distill import DistillConfig, batch_counts, train_distill
from training.rl.losses import (
    exact_reverse_kl_distillation_loss,
    group_advantages,
    grpo_icepop_loss,
    on_policy_distillation_advantages,
    on_policy_distillation_loss,
)
from training.rollout.multiturn import prompt_ids
from training.tasks.base import Task
from training.tokenizer import END_OF_TURN

# ------------------------------------------------------------------------------------------------ the loss


def test_advantage_is_the_detached_per_token_log_ratio():
    g = torch.Generator().manual_seed(0)
    student = (-torch.rand(3, 5, generator=g) * 3).requires_grad_(True)
    teacher = -torch.rand(3, 5, generator=g) * 3
    adv = on_policy_distillation_advantages(teacher, student)
    assert torch.equal(adv, (teacher - student).detach()) and not adv.requires_grad
    # inside the loss, at r = 1 and rho = 1 the gradient per token is -Â_t / |y_i| / B
    mask = torch.ones(3, 5)
    mask[1, 3:] = 0
    logp = student.detach().clone().requires_grad_(True)
    loss, stats = on_policy_distillation_loss(logp, student.detach(), student.detach(), teacher, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    lengths = mask.sum(1, keepdim=True)
    assert torch.allclose(grad, -(teacher - student.detach()) * mask / lengths / 3, atol=1e-6)
    assert stats.tokens == 13 and stats.masked_fraction == 0


def test_group_size_one_gives_a_signal_where_grpo_gives_none():
    logp_old = torch.tensor([[-1.0, -0.5, -2.0]])
    teacher = torch.tensor([[-0.2, -0.5, -3.0]])
    logp = logp_old.clone().requires_grad_(True)
    grpo, _ = grpo_icepop_loss(logp, logp_old, logp_old, group_advantages(torch.ones(1, 1)).flatten(),
                               torch.ones(1, 3))  # fmt: skip
    (g_grpo,) = torch.autograd.grad(grpo, logp)
    loss, _ = on_policy_distillation_loss(logp, logp_old, logp_old, teacher, torch.ones(1, 3))
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.all(g_grpo == 0)  # one sample per group: GRPO's advantage is 0
    # the teacher likes token 0 more (push up: negative gradient of the loss), token 2 less, token 1 equally
    assert g[0, 0] < 0 and g[0, 1] == 0 and g[0, 2] > 0


def test_masked_tokens_contribute_nothing():
    g = torch.Generator().manual_seed(1)
    logp_old = -torch.rand(2, 4, generator=g) * 2
    teacher = -torch.rand(2, 4, generator=g) * 2
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 0, 1, 0]])
    logp = logp_old.clone().requires_grad_(True)
    loss, _ = on_policy_distillation_loss(logp, logp_old, logp_old, teacher, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    # wild values on the masked tokens (teacher, student, engine) change neither the loss nor the gradient
    off = mask == 0
    wild_teacher = teacher.masked_fill(off, -50.0)
    wild_old = logp_old.masked_fill(off, -0.01)
    wild_infer = logp_old.masked_fill(off, -30.0)
    logp2 = wild_old.clone().requires_grad_(True)
    loss2, stats = on_policy_distillation_loss(logp2, wild_old, wild_infer, wild_teacher, mask)
    (grad2,) = torch.autograd.grad(loss2, logp2)
    assert loss.item() == pytest.approx(loss2.item(), abs=1e-7)
    assert torch.all(grad[off] == 0) and torch.allclose(grad, grad2)
    assert stats.tokens == 4 and stats.masked_fraction == 0  # the far-off rho of masked tokens is not counted


def _categorical_kl(theta: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    ls = torch.log_softmax(theta, -1)
    return (ls.exp() * (ls - teacher_logp)).sum()


def test_gradient_is_the_reverse_kl_gradient_and_moves_the_student_to_the_teacher():
    """A one-token 'policy' over 5 symbols: the sampled loss's gradient matches ∇ KL(π_θ || π_teacher) (score
    function identity), and on-policy steps drive the KL from about 1.4 to near 0."""
    teacher_logp = torch.log_softmax(torch.tensor([3.0, 0.0, 0.0, -1.0, 1.0]), -1)
    theta = torch.tensor([0.0, 2.0, 0.0, 1.0, -1.0], requires_grad=True)
    gen = torch.Generator().manual_seed(0)

    def sampled_loss(n: int) -> torch.Tensor:
        logp_all = torch.log_softmax(theta, -1)
        tokens = torch.multinomial(logp_all.detach().exp(), n, replacement=True, generator=gen)
        logp = logp_all[tokens].unsqueeze(1)  # n responses of one token each (group size 1)
        old = logp.detach()
        loss, _ = on_policy_distillation_loss(
            logp, old, old, teacher_logp[tokens].unsqueeze(1), torch.ones(n, 1)
        )
        return loss

    (g_sampled,) = torch.autograd.grad(sampled_loss(40_000), theta)
    (g_exact,) = torch.autograd.grad(_categorical_kl(theta, teacher_logp), theta)
    cosine = float(torch.nn.functional.cosine_similarity(g_sampled, g_exact, dim=0))
    assert cosine > 0.98, (g_sampled, g_exact)
    kl0 = float(_categorical_kl(theta.detach(), teacher_logp))
    opt = torch.optim.SGD([theta], lr=0.5)
    for _ in range(200):
        opt.zero_grad()
        sampled_loss(256).backward()
        opt.step()
    kl1 = float(_categorical_kl(theta.detach(), teacher_logp))
    assert kl0 > 1.0 and kl1 < 0.05 * kl0, (kl0, kl1)
    assert int(theta.argmax()) == 0  # the teacher's favourite symbol is now the student's


def test_exact_estimator_is_the_reverse_kl_at_each_position_with_icepop_and_the_mask():
    """The exact form's loss is the per-sequence mean of KL(π_θ || π_teacher) over the positions of each
    response; its gradient is ∇KL; masked positions and positions IcePop drops add nothing."""
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    teacher = torch.log_softmax(torch.randn(2, 3, 5, generator=g), -1)
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    logp_all = torch.log_softmax(theta, -1)
    old = torch.full((2, 3), -1.0)
    infer = old.clone()
    infer[1, 2] = old[1, 2] - 5.0  # rho = e^5 > beta: IcePop drops this position
    loss, stats = exact_reverse_kl_distillation_loss(logp_all, teacher, old, infer, mask, beta=2.0)
    kl = [[_categorical_kl(theta[i, t].detach(), teacher[i, t]) for t in range(3)] for i in range(2)]
    want = ((kl[0][0] + kl[0][1]) / 2 + (kl[1][0] + kl[1][1]) / 3) / 2  # row 1 still divides by its 3 tokens
    assert loss.item() == pytest.approx(float(want), rel=1e-5)
    (grad,) = torch.autograd.grad(loss, theta)
    (g00,) = torch.autograd.grad(_categorical_kl(theta[0, 0], teacher[0, 0]) / 2 / 2, theta)
    assert torch.allclose(grad[0, 0], g00[0, 0], atol=1e-6)
    assert torch.all(grad[0, 2] == 0) and torch.all(grad[1, 2] == 0)  # masked; dropped by IcePop
    assert stats.tokens == 5 and stats.masked_fraction == pytest.approx(1 / 5)


def test_exact_estimator_has_the_sampled_ones_expected_gradient_without_its_noise():
    """One-token policy, 16 answers per batch (the tiny batch): across batches the sampled loss's gradient
    scatters around ∇KL, the exact one is ∇KL every time."""
    teacher_logp = torch.log_softmax(torch.tensor([3.0, 0.0, 0.0, -1.0, 1.0]), -1)
    theta = torch.tensor([0.0, 2.0, 0.0, 1.0, -1.0], requires_grad=True)
    (g_true,) = torch.autograd.grad(_categorical_kl(theta, teacher_logp), theta)
    gen = torch.Generator().manual_seed(0)
    sampled, exact = [], []
    for _ in range(200):
        logp_all = torch.log_softmax(theta, -1)
        tokens = torch.multinomial(logp_all.detach().exp(), 16, replacement=True, generator=gen)
        logp = logp_all[tokens].unsqueeze(1)
        old, ones = logp.detach(), torch.ones(16, 1)
        s_loss, _ = on_policy_distillation_loss(logp, old, old, teacher_logp[tokens].unsqueeze(1), ones)
        e_loss, _ = exact_reverse_kl_distillation_loss(
            logp_all.expand(16, 1, 5), teacher_logp.expand(16, 1, 5), old, old, ones
        )
        sampled.append(torch.autograd.grad(s_loss, theta, retain_graph=True)[0])
        exact.append(torch.autograd.grad(e_loss, theta)[0])
    sampled, exact = torch.stack(sampled), torch.stack(exact)
    assert torch.allclose(exact, g_true.expand_as(exact), atol=1e-6)
    assert torch.allclose(sampled.mean(0), g_true, atol=0.1 * float(g_true.norm()))  # same expectation
    assert float((sampled - g_true).norm(dim=1).mean()) > 0.3 * float(g_true.norm())  # but noisy at 16


def test_batch_counts_follow_the_proportions():
    assert batch_counts({"a": 3, "b": 1}, ["a", "b"], 8) == {"a": 6, "b": 2}
    assert batch_counts({}, ["a", "b", "c"], 7) == {
        "a": 3,
        "b": 2,
        "c": 2,
    }  # equal shares, remainder to the first
    assert batch_counts({"a": 100, "b": 1}, ["a", "b"], 4) == {
        "a": 3,
        "b": 1,
    }  # a positive share gets a prompt
    assert batch_counts({"a": 1, "b": 0}, ["a", "b"], 4) == {"a": 4}
    with pytest.raises(ValueError, match="no teacher named"):
        batch_counts({"z": 1}, ["a"], 4)


def test_a_prompt_several_teachers_trained_on_goes_to_the_latest_of_them():
    from training.rl.distill import latest_owner

    def tasks(*ids):
        return [Task(i, "math", f"q {i}", "1", 1, "train") for i in ids]

    owned = latest_owner({
        "sft": tasks("r1", "r2", "a1", "c1"),  # SFT saw the reasoning tasks, one agentic task and a chat
        "reasoning_rl": tasks("r1", "r2", "r3"),
        "agentic_rl": tasks("a1", "a2"),
        "general_rl": tasks("r9"),
    })  # fmt: skip
    assert {n: [t.id for t in ts] for n, ts in owned.items()} == {
        "sft": ["c1"], "reasoning_rl": ["r1", "r2", "r3"], "agentic_rl": ["a1", "a2"], "general_rl": ["r9"],
    }  # fmt: skip
    # a teacher a later one covers entirely teaches nothing and is left out
    assert list(latest_owner({"sft": tasks("r1"), "reasoning_rl": tasks("r1", "r2")})) == ["reasoning_rl"]


# ------------------------------------------------------------------------------------------------ the loop


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tok, cfg = color_tokenizer_and_config(tmp_path_factory.mktemp("tok"))
    return tok, cfg, color_tasks("train", 16), color_tasks("heldout", 8, start=100)


def _fit_answer(model: torch.nn.Module, tok, tasks, word: str, steps: int, lr: float) -> torch.nn.Module:
    """A few supervised steps teaching `model` to answer `word` and end its turn (in place)."""
    answer = list(tok(word, add_special_tokens=False)["input_ids"]) + [tok.convert_tokens_to_ids(END_OF_TURN)]
    rows = [(prompt_ids(tok, t), answer) for t in tasks[:8]]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = 0.0
        for prompt, ans in rows:
            logits = model(input_ids=torch.tensor([prompt + ans])).logits[0, len(prompt) - 1 : -1]
            loss = loss + torch.nn.functional.cross_entropy(logits.float(), torch.tensor(ans))
        opt.zero_grad()
        (loss / len(rows)).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def stages(setup):
    """An earlier stage's checkpoint that answers 'blue' (P ~ 0.98) and a later stage trained from it toward
    'green' that has forgotten (its greedy answer is an empty turn): the regression distillation should undo."""
    tok, cfg, train, _ = setup
    teacher = _fit_answer(build_model(cfg, seed=1), tok, train, " blue", 40, 3e-3)
    drifted = _fit_answer(copy.deepcopy(teacher), tok, train, " green", 8, 3e-3)
    return teacher, drifted


@pytest.mark.parametrize("estimator", ["exact", "sampled"])
def test_distillation_moves_the_student_toward_the_teacher(setup, stages, estimator):
    tok, cfg, train, heldout = setup
    teacher, drifted = stages
    student = copy.deepcopy(drifted)
    before = copy.deepcopy(student.state_dict())
    rows: list[tuple[int, dict]] = []
    config = DistillConfig(
        steps=25, prompts_per_step=8, max_new_tokens=4, max_turns=1, learning_rate=1e-3,
        eval_every=25, eval_prompts_per_teacher=8, eval_tasks_per_domain=8, estimator=estimator,
    )  # fmt: skip
    final = train_distill(
        student, tok, {"sft": teacher}, {"sft": train}, config, lambda m, s: rows.append((s, dict(m))),
        suites={"color": SayBlue()}, heldout_prompts={"sft": heldout}, heldout_tasks=heldout,
    )  # fmt: skip
    kl = [m["reverse_kl/sft"] for s, m in rows if "reverse_kl/sft" in m]
    assert len(kl) == 25
    first, last = sum(kl[:5]) / 5, sum(kl[-5:]) / 5
    assert last < 0.5 * first, (first, last)
    evals = [m for s, m in rows if "heldout/agreement/sft" in m]
    assert len(evals) == 2
    assert evals[1]["heldout/agreement/sft"] > evals[0]["heldout/agreement/sft"] + 0.3, evals
    assert evals[1]["heldout/reverse_kl_exact/sft"] < 0.5 * evals[0]["heldout/reverse_kl_exact/sft"], evals
    assert (
        final["heldout/pass_at_1/color"] > evals[0]["heldout/pass_at_1/color"]
    )  # says blue like its teacher
    steps = [m for s, m in rows if "rho/mean" in m]
    assert any(m["rho/min"] != m["rho/max"] for m in steps)  # bf16 engine vs fp32 trainer: IcePop is live
    assert all(0 <= m["icepop/masked_fraction"] <= 1 and m["prompts/sft"] == 8 for m in steps)
    assert any(not torch.equal(before[n], p) for n, p in student.state_dict().items())
    assert all(not p.requires_grad for p in teacher.parameters())


def test_a_resumed_distillation_reaches_the_weights_of_an_uninterrupted_one(setup, stages, tmp_path):
    from training.rl.loop import resume_step

    tok, cfg, train, heldout = setup
    teacher, drifted = stages
    config = DistillConfig(steps=4, prompts_per_step=4, max_new_tokens=4, max_turns=1, learning_rate=1e-3,
                           eval_every=4, eval_prompts_per_teacher=2, checkpoint_every=2)  # fmt: skip

    def run(steps: int, ckpt):
        student, logged = copy.deepcopy(drifted), []
        train_distill(student, tok, {"sft": teacher}, {"sft": train}, config.model_copy(update={"steps": steps}),
                      lambda m, s: logged.append(s), heldout_prompts={"sft": heldout}, checkpoint_dir=ckpt,
                      job="j")  # fmt: skip
        return student, logged

    whole, _ = run(4, None)
    run(3, tmp_path)  # saves step 2, dies at step 3
    assert resume_step(tmp_path) == 2
    resumed, logged = run(4, tmp_path)
    assert min(logged) == 3
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(whole.lm_head.weight, drifted.lm_head.weight)


def test_each_prompt_is_scored_by_the_teacher_of_its_set(setup, stages):
    """Two teachers whose sets share prompts (as SFT's and Reasoning RL's do): each step takes prompts in the
    configured proportions, and the per-teacher reverse KL is only zero for the teacher that is the student."""
    tok, cfg, train, _ = setup
    student = copy.deepcopy(stages[1])
    other = train[:4]  # the same tasks, ids and all
    rows: list[dict] = []
    config = DistillConfig(steps=2, prompts_per_step=4, proportions={"self": 3, "other": 1}, max_new_tokens=3,
                           max_turns=1, learning_rate=1e-9, eval_every=2, engine_dtype="float32")  # fmt: skip
    train_distill(
        student, tok, {"self": copy.deepcopy(student), "other": stages[0]},
        {"self": train, "other": other}, config, lambda m, s: rows.append(dict(m)),
    )  # fmt: skip
    steps = [m for m in rows if "reverse_kl/self" in m]
    assert len(steps) == 2
    assert all(m["prompts/self"] == 3 and m["prompts/other"] == 1 for m in steps)
    assert all(abs(m["reverse_kl/self"]) < 1e-4 and m["reverse_kl/other"] > 0.1 for m in steps), steps


def test_the_job_reads_its_spec_and_exports_the_student(setup, stages, tmp_path):
    """The child-process entry, run in process: checkpoints and prompt sets from files, result.json with the
    metrics before (`parent/`) and after, and an HF export that loads."""
    from training.checkpoint import export_hf
    from training.model import load_model
    from training.rl.distill_job import DistillJobSpec, main
    from training.tasks.suites import write_tasks

    tok, cfg, train, heldout = setup
    tok_files = {n: Path(tok.name_or_path) / n for n in ("tokenizer.json", "tokenizer_config.json")}
    student_dir = export_hf(stages[1], tmp_path / "student", tok_files)
    teacher_dir = export_hf(stages[0], tmp_path / "teacher", tok_files)
    spec = DistillJobSpec(
        run_dir=str(tmp_path / "run"), init_from=str(student_dir), model=cfg, teachers={"sft": str(teacher_dir)},
        teacher_tasks={"sft": str(write_tasks(train, tmp_path / "train.jsonl"))},
        teacher_heldout={"sft": str(write_tasks(heldout, tmp_path / "heldout.jsonl"))},
        config=DistillConfig(steps=2, prompts_per_step=4, max_new_tokens=3, max_turns=1, eval_every=2,
                             eval_prompts_per_teacher=4),
    )  # fmt: skip
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    assert main(["--spec", str(tmp_path / "spec.json")]) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    m = result["metrics"]
    assert {"parent/agreement/sft", "heldout/agreement/sft", "reverse_kl/sft", "rho/mean"} <= set(m)
    assert m["parent/agreement/sft"] == 0.0  # the drifted student's greedy answer is not the teacher's
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("reverse_kl/sft" in r for r in rows) == 2
    assert load_model(result["hf_dir"]) is not None


def test_the_job_names_a_teacher_without_prompts(tmp_path, setup):
    from training.rl.distill_job import DistillJobSpec, _check

    spec = DistillJobSpec(run_dir=str(tmp_path), init_from=str(tmp_path), model=setup[1],
                          teachers={"sft": str(tmp_path)}, teacher_tasks={}, config=DistillConfig())  # fmt: skip
    with pytest.raises(ValueError, match=r"\['sft'\] have no teacher_tasks"):
        _check(spec)


def test_the_results_table_shows_the_regression_and_its_recovery(setup, stages, tmp_path):
    """The recipe's claim in miniature: an earlier stage's metric drops after a later stage and comes back with
    distillation from the same parent, in one table (training/report.py) with standard errors."""
    from training.checkpoint import export_hf
    from training.report import HeldoutSets, ReportConfig, post_training_report, recovery_rows, test_split_row

    tok, cfg, train, heldout = setup
    teacher, drifted = stages
    student = copy.deepcopy(drifted)
    config = DistillConfig(steps=25, prompts_per_step=8, max_new_tokens=4, max_turns=1, learning_rate=1e-3,
                           eval_every=25, eval_prompts_per_teacher=2)  # fmt: skip
    train_distill(student, tok, {"sft": teacher}, {"sft": train}, config, lambda m, s: None)
    files = {n: Path(tok.name_or_path) / n for n in ("tokenizer.json", "tokenizer_config.json")}
    chain = {
        name: export_hf(model, tmp_path / name, files)
        for name, model in (("sft", teacher), ("later_rl", drifted), ("distilled", student))
    }
    more = [Task(f"m{i}", "color", f"pick a color {i + 200}", "blue", 1, "heldout") for i in range(16)]
    test = [Task(f"t{i}", "color", f"pick a color {i + 400}", "blue", 1, "test") for i in range(16)]
    sets = HeldoutSets(reasoning=heldout + more, test=test, verifiers={"color": SayBlue()})
    report = post_training_report(
        chain, sets, ReportConfig(max_new_tokens=4, max_turns=1), tmp_path, tokenizer=tok
    )
    scores = {n: s["pass_at_1/color"][0] for n, s in report.scores.items()}
    assert scores["sft"] > 0.9 and scores["later_rl"] < 0.1 and scores["distilled"] > 0.9, scores
    row, test_row = recovery_rows(report.scores, "later_rl", "distilled", items=report.items)
    assert row["teacher"] == "sft" and row["drop"] > 0.8 and row["within_se"], row
    assert test_split_row([row, test_row], row)["holds"], test_row  # and it holds on the unseen test split
    assert row["clear drop"] and row["drop"] > 2 * row["drop SE (paired)"], row
