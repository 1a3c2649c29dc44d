"""The drill book of lab 08 (issue #51): each reference against an independent implementation or a hand-computed
value, the solution notebook's drills passing and the learner copy's not attempted, every registered mistake
failing with its own hint (written as a learner would, as the honest corpus pastes it), and the same mistakes
failing their drill only, and nothing else, through the grader's answering step."""

import math

import nbformat
import pytest
import torch
import torch.nn.functional as F

import honest_corpus
from labkit.exercises import exercises, get
from labkit.exercises.checking import check_function
from labkit.exercises import lab08

DRILLS = exercises("08")
IDS = [exercise.id for exercise in DRILLS]


def _notebook_functions(notebook) -> dict:
    """The namespace of a lab 08 notebook's import cell and its drill cells (the cells that define a drill's
    function), run in order: what a check in that notebook sees."""
    namespace: dict = {}
    functions = {exercise.function for exercise in DRILLS}
    for cell in notebook.cells:
        source = cell.source if cell.cell_type == "code" else ""
        if source.startswith("import math") or any(source.startswith(f"def {name}(") for name in functions):
            exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - the course's own notebook
    return namespace


def _as_learner(exercise, function):
    """``function`` of lab08.py pasted into a cell as a learner would (its private helpers too), then run."""
    namespace: dict = {}
    exec(compile(honest_corpus.mistake_source(exercise, function), "<learner cell>", "exec"), namespace)  # noqa: S102
    return namespace[exercise.function]


# ----- the registrations -----


def test_the_drills_in_notebook_order_each_a_code_exercise_with_three_mistakes_or_more():
    assert IDS == ["08.rms_norm", "08.apply_rotary", "08.causal_padding_mask", "08.repeat_kv", "08.cache_append",
                   "08.attend_one_query", "08.online_softmax", "08.min_p", "08.repetition_penalty",
                   "08.pack_int4", "08.unpack_int4", "08.int4_groups", "08.swiglu_mlp"]
    for exercise in DRILLS:
        assert exercise.kind == "code" and exercise.n_random == 25 and exercise.points == 1, exercise.id
        assert len(exercise.mistakes) >= 3 and len(exercise.hand_cases) >= 3, exercise.id
        assert len({mistake.hint for mistake in exercise.mistakes}) == len(exercise.mistakes), exercise.id
    assert sum(exercise.kind == "code" for exercise in exercises()) >= 32  # the course's code exercises


def test_the_notebook_states_each_drills_lab_and_what_may_be_called():
    text = "\n".join(cell.source for cell in honest_corpus.solution("08").cells if cell.cell_type == "markdown")
    assert text.count("*Belongs to lab") == len(DRILLS)
    for exercise in DRILLS:
        assert f"**What you may call.** {exercise.allowed_text}" in text, exercise.id
        assert f'check("{exercise.id}")' in "\n".join(c.source for c in honest_corpus.solution("08").cells)


# ----- the solution notebook passes, the learner copy is not attempted -----


@pytest.fixture(scope="module")
def solution_functions():
    return _notebook_functions(honest_corpus.solution("08"))


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_solution_notebooks_drill_passes_and_the_learner_copys_is_not_attempted(exercise_id, solution_functions):
    exercise = get(exercise_id)
    for seed in (0, 1, 2):
        verdict = check_function(exercise, solution_functions[exercise.function], seed=seed)
        assert verdict.status == "passed", verdict
    learner = _notebook_functions(honest_corpus.learner_copy("08"))
    assert check_function(exercise, learner[exercise.function]).status == "not attempted"


# ----- the bug zoo: every mistake fails with its own hint -----


@pytest.mark.parametrize("exercise, index, wrong", list(honest_corpus.mistakes(("08",))),
                         ids=lambda value: getattr(value, "id", getattr(value, "__name__", str(value))))
def test_every_mistake_written_by_a_learner_fails_with_its_own_hint(exercise, index, wrong):
    function = _as_learner(exercise, wrong)
    for seed in (0, 1, 2):
        verdict = check_function(exercise, function, seed=seed)
        assert verdict.status == "failed", (wrong.__name__, verdict)
        assert f"hint:     {exercise.mistakes[index].hint}" in str(verdict), (wrong.__name__, str(verdict))


ACCUSATIONS = ("may not", "a copy of", "forbidden")


def test_the_solution_notebook_earns_every_point_through_the_graders_answering_step(solution_functions):
    """`labkit grade`'s judging of the solution notebook's drills, answered in this process (the wall's own tests
    run the answering step in a sandbox): every drill passes, with no accusation."""
    from labkit.instructor.grader import judging
    from labkit.instructor.wall import disarming

    _, plan, drawn = judging.plan("08", seed=51)
    answers = disarming.answer_plan(dict(solution_functions), {"exercises": plan})
    for drill in DRILLS:
        result = judging.judge(drill, drawn[drill.id], answers, None)
        assert (result.status, result.points) == ("passed", 1), result
        assert not any(word in " ".join(result.details) for word in ACCUSATIONS), result.details


@pytest.mark.parametrize("exercise, index, wrong", list(honest_corpus.mistakes(("08",))),
                         ids=lambda value: getattr(value, "id", getattr(value, "__name__", str(value))))
def test_a_mistake_costs_its_drill_only_through_the_graders_answering_step(exercise, index, wrong,
                                                                          solution_functions):
    """The honest corpus's submission for this mistake: the solution notebook with the drill's cell replaced by the
    mistake as a learner writes it. Through the answering step its drill fails with no accusation, and every other
    drill's function is the solution's, untouched (which earns every point: the test above)."""
    from labkit.instructor.grader import judging
    from labkit.instructor.wall import disarming

    namespace = dict(solution_functions)
    exec(compile(honest_corpus.mistake_source(exercise, wrong), "<learner cell>", "exec"), namespace)  # noqa: S102
    for drill in DRILLS:
        assert (namespace[drill.function] is solution_functions[drill.function]) == (drill is not exercise), drill.id
    _, plan, drawn = judging.plan("08", seed=51 + index)
    answers = disarming.answer_plan(namespace, {"exercises": [item for item in plan if item["id"] == exercise.id]})
    result = judging.judge(exercise, drawn[exercise.id], answers, None)
    assert (result.status, result.points) == ("failed", 0), result
    assert not any(word in " ".join(result.details) for word in ACCUSATIONS), result.details


# ----- the references, against independent implementations and hand-computed values -----


def test_rms_norm_is_torchs_and_worked_by_hand():
    generator = torch.Generator().manual_seed(0)
    x, gain = torch.randn(3, 5, 16, generator=generator), torch.rand(16, generator=generator)
    for eps in (1e-6, 0.5):
        assert torch.allclose(lab08.rms_norm(x, gain, eps), F.rms_norm(x, (16,), gain, eps), rtol=1e-5, atol=1e-6)
    rms = math.sqrt(12.5)  # (3, 4): mean of squares (9 + 16) / 2
    assert lab08.rms_norm(torch.tensor([[3.0, 4.0]]), torch.ones(2), 0.0)[0].tolist() == pytest.approx(
        [3 / rms, 4 / rms], rel=1e-6)
    assert lab08.rms_norm(torch.zeros(1, 4), torch.ones(4), 1e-6).tolist() == [[0.0] * 4]


def test_rotary_is_transformers_llama_rope():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    head_dim, base = 64, 10000.0
    config = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, rope_theta=base,
                         max_position_embeddings=512)
    rotary = LlamaRotaryEmbedding(config)
    generator = torch.Generator().manual_seed(1)
    query, key = torch.randn(1, 1, 9, head_dim, generator=generator), torch.randn(1, 1, 9, head_dim, generator=generator)
    positions = torch.tensor([[0, 1, 2, 3, 50, 51, 200, 300, 399]])
    cos, sin = rotary(query, positions)
    theirs, _ = apply_rotary_pos_emb(query, key, cos, sin)
    ours = lab08.apply_rotary(query[0, 0], positions[0], base)
    assert torch.allclose(ours, theirs[0, 0], rtol=1e-4, atol=2e-4)


def test_rotary_keeps_norms_and_scores_depend_on_the_distance_only():
    rotated = lab08.apply_rotary(torch.tensor([[1.0, 0.0]]), torch.tensor([1]), 10000.0)
    assert rotated[0].tolist() == pytest.approx([math.cos(1), math.sin(1)], abs=1e-6)  # head_dim 2: the angle is p
    generator = torch.Generator().manual_seed(2)
    query, key = torch.randn(1, 32, generator=generator), torch.randn(1, 32, generator=generator)
    at = lambda vector, position: lab08.apply_rotary(vector, torch.tensor([position]), 500000.0)
    scores = [float(at(query, m) @ at(key, m - 4).T) for m in (4, 9, 100)]
    assert max(scores) - min(scores) < 1e-4
    assert float(at(query, 7).norm()) == pytest.approx(float(query.norm()), rel=1e-6)


def test_the_mask_by_hand():
    allowed = lab08.causal_padding_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert allowed.dtype == torch.bool
    assert allowed.int().tolist() == [[[0, 0, 0], [0, 1, 0], [0, 1, 1]], [[1, 0, 0], [1, 1, 0], [1, 1, 1]]]


def test_repeat_kv_is_transformers():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import repeat_kv

    kv = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(3))
    for n_rep in (1, 2, 3):
        assert torch.equal(lab08.repeat_kv(kv, n_rep), repeat_kv(kv, n_rep))


def test_one_query_attention_is_sdpa_with_grouped_heads():
    generator = torch.Generator().manual_seed(4)
    for n_heads, n_kv_heads, length in ((4, 4, 1), (6, 2, 9), (8, 1, 30)):
        query = torch.randn(n_heads, 16, generator=generator)
        keys, values = (torch.randn(n_kv_heads, length, 16, generator=generator) for _ in range(2))
        theirs = F.scaled_dot_product_attention(query[None, :, None], keys[None], values[None], enable_gqa=True)
        assert torch.allclose(lab08.attend_one_query(query, keys, values), theirs[0, :, 0], rtol=1e-5, atol=1e-6)


def test_a_cache_step_stores_the_rotated_key_at_the_position_after_the_cache():
    generator = torch.Generator().manual_seed(5)
    keys, values = torch.randn(2, 3, 8, generator=generator), torch.randn(2, 3, 8, generator=generator)
    new_key, new_value = torch.randn(2, 8, generator=generator), torch.randn(2, 8, generator=generator)
    cache = lab08.cache_append(keys, values, new_key, new_value, 10000.0)
    assert cache.shape == (2, 2, 4, 8)
    assert torch.equal(cache[0, :, :3], keys) and torch.equal(cache[1, :, :3], values)
    assert torch.equal(cache[1, :, 3], new_value)
    assert torch.allclose(cache[0, :, 3], lab08.apply_rotary(new_key, torch.tensor([3, 3]), 10000.0))


def test_online_softmax_by_hand_and_its_last_state_gives_softmax():
    states = lab08.online_softmax(torch.tensor([0.0, 0.0, math.log(2.0), math.log(2.0)]), 2)
    assert states.flatten().tolist() == pytest.approx([0.0, 2.0, math.log(2.0), 3.0], rel=1e-6)  # 2 rescaled to 1, + 1 + 1
    masked = lab08.online_softmax(torch.tensor([-math.inf, -math.inf, 1.0]), 2)
    assert masked.tolist() == [[-math.inf, 0.0], [1.0, 1.0]]
    scores = torch.randn(300, generator=torch.Generator().manual_seed(6)) * 4
    for block_size in (1, 7, 300):
        running_max, running_sum = lab08.online_softmax(scores, block_size)[-1].double().tolist()
        assert torch.allclose((scores.double() - running_max).exp() / running_sum, scores.double().softmax(-1),
                              rtol=1e-5)


def test_repetition_penalty_is_transformers():
    pytest.importorskip("transformers")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    generator = torch.Generator().manual_seed(7)
    for penalty in (1.0, 1.2, 0.7, 3.0):
        logits = torch.randn(40, generator=generator) * 3
        previous = torch.randint(0, 40, (25,), generator=generator)  # with repeats
        theirs = RepetitionPenaltyLogitsProcessor(penalty=penalty)(previous[None], logits[None].clone())[0]
        assert torch.equal(lab08.repetition_penalty(logits, previous, penalty), theirs)
    assert lab08.repetition_penalty(torch.tensor([2.0, -2.0, 0.0]), torch.tensor([0, 1, 2, 1]), 2.0).tolist() == [
        1.0, -4.0, 0.0]


def test_packing_by_hand_and_round_trips():
    assert lab08.pack_int4(torch.tensor([1, 2, 15, 0, 15, 15], dtype=torch.uint8)).tolist() == [33, 15, 255]
    every_byte = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(lab08.pack_int4(lab08.unpack_int4(every_byte)), every_byte)
    codes = torch.randint(0, 16, (3, 10), generator=torch.Generator().manual_seed(8), dtype=torch.uint8)
    assert torch.equal(lab08.unpack_int4(lab08.pack_int4(codes)), codes)


def test_int4_groups_is_labkits_affine_quantizer_per_group():
    from labkit.core.quantization import fake_quantize

    generator = torch.Generator().manual_seed(9)
    for _ in range(20):
        case = lab08._int4_case(generator)
        weight, group_size = case.args
        assert not lab08._int4_near_a_tie(weight, group_size)
        theirs = fake_quantize(weight, 4, "affine", "group", group_size=group_size)
        assert torch.allclose(lab08.int4_groups(weight, group_size), theirs, rtol=1e-5, atol=1e-6), case.label
    assert lab08.int4_groups(torch.zeros(2, 4), 2).tolist() == [[0.0] * 4] * 2
    assert lab08._int4_near_a_tie(torch.tensor([[0.0, 1.5]]), 2) is False  # s = 0.1: 15 codes exactly
    assert lab08._int4_near_a_tie(torch.tensor([[0.0, 1.5, -1.0, 2.0]]), 4)  # s = 0.2: 1.5 / 0.2 = 7.5


def test_swiglu_is_transformers_llama_mlp():
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    with torch.random.fork_rng():  # LlamaMLP's Linears draw their weights from torch's global generator
        torch.manual_seed(11)
        mlp = LlamaMLP(LlamaConfig(hidden_size=12, intermediate_size=20, num_attention_heads=2, hidden_act="silu"))
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        theirs = mlp(x)
    ours = lab08.swiglu_mlp(x, mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach(), mlp.down_proj.weight.detach())
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    silu_one = 1 / (1 + math.exp(-1))  # silu(1) * 1 and silu(-2) * (-2), by hand
    assert lab08.swiglu_mlp(torch.tensor([[1.0, -2.0]]), torch.eye(2), torch.eye(2), torch.eye(2))[0].tolist() == (
        pytest.approx([silu_one, 4 / (1 + math.exp(2))], rel=1e-6))


def test_min_p_random_cases_keep_away_from_the_bar():
    generator = torch.Generator().manual_seed(10)
    for _ in range(200):
        logits, threshold = lab08._min_p_case(generator).args
        if 0 < threshold < 1:
            gaps = logits - logits.max(dim=-1, keepdim=True).values
            assert bool(((gaps - math.log(threshold)).abs() > lab08.MIN_P_MARGIN).all())


def test_the_notebook_opens_with_the_progress_table_and_it_reads_the_saved_progress(tmp_path, monkeypatch):
    from labkit.exercises import progress, summary

    for notebook in (honest_corpus.solution("08"), honest_corpus.learner_copy("08")):
        code = [cell.source for cell in notebook.cells if cell.cell_type == "code"]
        assert code[2] == 'summary("08")' and code[-1] == 'summary("08")'  # after the Colab and import cells
    monkeypatch.setenv("LABKIT_PROGRESS", str(tmp_path / "progress.json"))
    progress.record("08.rms_norm", "passed", 1, 1)
    progress.record("08.repeat_kv", "failed", 0, 1)
    rows = {row[0]: (row[2], row[3]) for row in summary("08").rows}
    assert rows.pop("08.rms_norm") == ("passed", 1) and rows.pop("08.repeat_kv") == ("failed", 0)
    assert set(rows.values()) == {("not attempted", 0)} and len(rows) == 11
