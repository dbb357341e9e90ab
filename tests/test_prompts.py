"""The built-in prompt suite, the JSONL readers (Spec-Bench/MT-Bench question format and
`{"prompt", "domain"}` lines), their errors, and select()."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from specprobe.core.errors import InputError
from specprobe.prompts import (
    DOMAINS,
    MT_BENCH_CATEGORIES,
    SPEC_BENCH_CATEGORIES,
    SPEC_BENCH_TASKS,
    Prompt,
    PromptSet,
    builtin_suite,
    domain_for,
    load_prompts,
    select,
    spec_bench_task,
)

DATA = Path(__file__).parent / "data" / "prompts"


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------ built-in suite


def test_builtin_covers_every_domain_with_at_least_eight_prompts():
    suite = builtin_suite()
    assert suite.name == "builtin" and suite.source == "builtin"
    groups = suite.by_domain()
    assert list(groups) == list(DOMAINS)
    for domain in DOMAINS:
        assert len(groups[domain]) >= 8, domain


def test_builtin_ids_unique_and_prompts_short():
    suite = builtin_suite()
    ids = [p.id for p in suite.prompts]
    assert len(ids) == len(set(ids))
    for p in suite.prompts:
        assert len(p.turns) == 1 and p.turns[0].strip()
        # Kept short so a 135M model with an 8k context handles prompt + continuation.
        assert len(p.turns[0].split()) <= 120, p.id
        assert p.category == p.domain


def test_builtin_ships_as_package_data():
    from importlib import resources

    assert resources.files("specprobe.prompts").joinpath("builtin.jsonl").is_file()


# ---------------------------------------------------------------------------- loading


def test_spec_bench_fixture_loads_every_line_shape():
    ps = load_prompts(DATA / "spec_bench_question.jsonl")
    assert ps.name == "spec_bench_question.jsonl"
    assert Path(ps.source).is_absolute()
    assert len(ps) == 16
    # The file's own 13 categories are kept, beside the six folded domains.
    assert set(ps.categories) == set(SPEC_BENCH_CATEGORIES) and len(SPEC_BENCH_CATEGORIES) == 13
    assert set(ps.domains) == set(DOMAINS)
    by_id = {p.id: p for p in ps.prompts}
    # MT-Bench's questions keep both turns.
    for p in ps.prompts:
        assert len(p.turns) == (2 if p.category in MT_BENCH_CATEGORIES else 1), p.id
    assert ps.num_turns == 8 * 2 + 8
    assert (by_id["1"].category, by_id["1"].domain) == ("writing", "chat")
    assert (by_id["401"].category, by_id["401"].domain) == ("rag", "qa")
    assert (by_id["321"].category, by_id["321"].domain) == ("math_reasoning", "math")
    # Text references are kept (the first of a list answers the first turn) ...
    assert by_id["21"].reference == "Four books."
    assert by_id["81"].reference.startswith("The train to Hamburg")
    assert by_id["241"].reference == "Mars"
    # ... lists of answer-span lists, an empty list and a missing key are not, and load.
    assert by_id["401"].reference is None and by_id["401"].reference_shape == "`reference` as a list of lists"
    assert by_id["402"].reference is None and by_id["402"].reference_shape == "`reference` as a list of lists"
    assert by_id["403"].reference is None and by_id["403"].reference_shape is None
    assert by_id["404"].reference is None and by_id["404"].reference_shape is None
    assert by_id["11"].reference is None and by_id["11"].reference_shape is None


def test_spec_bench_whole_file_size_loads(tmp_path):
    # A file the size of Spec-Bench's (480 questions, 13 categories, 80 per task),
    # built from the fixture's shapes: nothing stops part-way.
    shapes = [json.loads(line) for line in (DATA / "spec_bench_question.jsonl").read_text("utf-8").splitlines()]
    rows = []
    for i in range(480):
        row = dict(shapes[i % len(shapes)])
        row["question_id"] = i + 1
        rows.append(row)
    ps = load_prompts(write_jsonl(tmp_path / "question.jsonl", rows))
    assert len(ps) == 480
    assert len(ps.by_category()) == 13
    assert {spec_bench_task(c) for c in ps.categories} == set(SPEC_BENCH_TASKS)


def test_mt_bench_fixture_keeps_both_turns():
    ps = load_prompts(DATA / "mt_bench_question.jsonl")
    assert len(ps) == 8
    assert ps.categories == list(MT_BENCH_CATEGORIES)
    assert all(len(p.turns) == 2 for p in ps.prompts)
    assert {spec_bench_task(c) for c in ps.categories} == {"mt_bench"}
    by_id = {p.id: p for p in ps.prompts}
    assert by_id["101"].turns[1] == "What if you overtake the runner in last place?"
    assert by_id["101"].reference == "Second place."
    assert by_id["81"].reference is None
    assert [p.domain for p in ps.prompts] == ["chat", "chat", "math", "math", "code", "qa", "qa", "chat"]


def test_messages_for_a_later_turn_carry_the_earlier_answers():
    p = load_prompts(DATA / "mt_bench_question.jsonl").prompts[2]
    assert p.num_turns == 2
    assert p.messages(0) == [{"role": "user", "content": p.turns[0]}]
    # The same answers list serves every turn; answers past the turn are ignored.
    assert p.messages(0, ["own answer"]) == p.messages(0)
    assert p.messages(1, ["own answer", "ignored"]) == [
        {"role": "user", "content": p.turns[0]},
        {"role": "assistant", "content": "own answer"},
        {"role": "user", "content": p.turns[1]},
    ]
    with pytest.raises(ValueError, match="needs the answers"):
        p.messages(1)
    with pytest.raises(IndexError, match="no turn 2"):
        p.messages(2, ["a", "b"])


def test_require_references_explains_non_text_shapes():
    ps = load_prompts(DATA / "spec_bench_question.jsonl")
    with pytest.raises(InputError, match=r"9 of 16 have none \(first: 1;.*list of lists instead of text") as info:
        ps.require_references()
    assert "\n" not in info.value.message and info.value.hint
    # Tasks whose references are text pass.
    select(ps, categories=["translation", "summarization", "QA"]).require_references()


def test_reference_shapes_are_never_an_error(tmp_path):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "num", "prompt": "x", "reference": 3},
            {"id": "obj", "prompt": "x", "reference": {"text": "r"}},
            {"id": "nums", "prompt": "x", "reference": [1, 2]},
            {"id": "blank", "prompt": "x", "reference": ["  "]},
            {"id": "next-key", "prompt": "x", "reference": [["span"]], "answer": "text answer"},
            {"question_id": "t", "turns": ["x", "y"], "reference": [["a"], ["b"]]},
        ],
    )
    got = {p.id: (p.reference, p.reference_shape) for p in load_prompts(f).prompts}
    assert got == {
        "num": (None, "`reference` as a number"),
        "obj": (None, "`reference` as an object"),
        "nums": (None, "`reference` as a list of numbers"),
        "blank": (None, None),
        "next-key": ("text answer", None),
        "t": (None, "`reference` as a list of lists"),
    }


def test_category_kept_beside_domain(tmp_path):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "prompt": "x", "domain": "qa", "category": "rag"},
            {"question_id": 2, "turns": ["x"], "category": "mt_bench_writing"},
            {"question_id": 3, "turns": ["x"], "category": "Legal"},
        ],
    )
    a, b, c = load_prompts(f).prompts
    assert (a.category, a.domain) == ("rag", "qa")
    assert (b.category, b.domain) == ("mt_bench_writing", "chat")
    assert spec_bench_task(b.category) == "mt_bench" and spec_bench_task(c.category) is None
    assert (c.category, c.domain) == ("Legal", "legal")


def test_select_by_category():
    ps = load_prompts(DATA / "spec_bench_question.jsonl")
    out = select(ps, categories=["RAG"])
    assert [p.id for p in out.prompts] == ["401", "402", "403", "404"]
    assert select(ps, categories=["rag", "qa"], max_prompts=2).categories == ["qa", "rag"]
    with pytest.raises(InputError, match=r"unknown category legal .*available: writing, roleplay"):
        select(ps, categories=["legal"])


def test_prompt_format_fixture_loads():
    ps = load_prompts(str(DATA / "simple_prompts.jsonl"))
    assert [p.id for p in ps.prompts] == ["greet", "line-3", "law-1"]
    greet, mult, law = ps.prompts
    assert greet.domain == "chat" and greet.category == "Chat"
    assert greet.turns == ("Say hello to a new colleague in two sentences.",)
    assert mult.reference == "391"
    # An unknown domain is kept, lower-cased, as its own slice.
    assert law.domain == "legal"
    assert law.reference.startswith("A contract")
    assert ps.domains == ["chat", "math", "legal"]


@pytest.mark.parametrize(
    ("category", "domain"),
    [
        ("coding", "code"),
        ("math", "math"),
        ("math_reasoning", "math"),
        ("reasoning", "math"),
        ("writing", "chat"),
        ("roleplay", "chat"),
        ("humanities", "chat"),
        ("summarization", "summarization"),
        ("translation", "translation"),
        ("qa", "qa"),
        ("rag", "qa"),
        ("extraction", "qa"),
        ("stem", "qa"),
        ("Poetry", "poetry"),
        ("CODING", "code"),
    ],
)
def test_category_mapping(category, domain):
    assert domain_for(category) == domain


def test_reference_keys_and_missing_fields(tmp_path):
    f = write_jsonl(
        tmp_path / "p.jsonl",
        [
            {"id": "a", "prompt": "x", "domain": "qa", "reference": "r1"},
            {"id": "b", "prompt": "y", "domain": "qa", "response": "r2"},
            {"id": "c", "prompt": "z", "domain": "qa", "answer": ["r3", "later"]},
            {"id": "d", "prompt": "w"},
            {"question_id": 7, "turns": ["t"], "category": "stem", "reference": "plain"},
        ],
    )
    ps = load_prompts(f)
    assert [p.reference for p in ps.prompts] == ["r1", "r2", "r3", None, "plain"]
    assert ps.prompts[3].domain == "general"
    assert ps.prompts[4].id == "7"


def test_blank_lines_crlf_and_bom_are_tolerated(tmp_path):
    f = tmp_path / "p.jsonl"
    body = '\r\n{"prompt": "héllo", "domain": "chat"}\r\n\r\n   \r\n{"prompt": "b"}\r\n'
    f.write_bytes(b"\xef\xbb\xbf" + body.encode("utf-8"))
    ps = load_prompts(f)
    assert [p.turns[0] for p in ps.prompts] == ["héllo", "b"]
    assert [p.id for p in ps.prompts] == ["line-2", "line-5"]


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (['{"prompt": "ok"}', "{not json"], r":2: not valid JSON"),
        (['{"prompt": "ok"}', "", '["a list"]'], r":3: not a JSON object"),
        (['{"domain": "chat"}'], r":1: no prompt text"),
        (['{"prompt": "a"}', '{"turns": "just a string"}'], r":2: `turns` must be a list"),
        (['{"turns": []}'], r":1: `turns` must be a list"),
        (['{"turns": ["ok", ""]}'], r":1: `turns` must be a list of non-empty strings"),
        (['{"turns": ["ok", 3]}'], r":1: `turns` must be a list"),
        (['{"prompt": "   "}'], r":1: `prompt` must be a non-empty string"),
        (['{"prompt": 5}'], r":1: `prompt` must be"),
        (
            [
                '{"question_id": 1, "turns": ["a"]}',
                '{"id": "x", "prompt": "b"}',
                '{"question_id": 1, "turns": ["c"]}',
            ],
            r":3: duplicate id '1' \(first on line 1\)",
        ),
        (['{"prompt": "a", "domain": 3}'], r":1: category/domain must be a string"),
        (['{"prompt": "a", "id": true}'], r":1: id must be"),
        (['{"question_id": 1, "turns": ["a"]}', '{"question_id": "1", "turns": ["b"]}'], r":2: duplicate id '1'"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, lines, match):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match=match) as info:
        load_prompts(f)
    assert "bad.jsonl" in info.value.message
    assert info.value.hint
    assert "\n" not in info.value.message


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="does not exist") as info:
        load_prompts(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in info.value.message


def test_directory(tmp_path):
    with pytest.raises(InputError, match="is a directory"):
        load_prompts(tmp_path)


def test_not_utf8_names_the_line(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"latin1\.jsonl:2: not UTF-8"):
        load_prompts(f)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        # mtime=0: gzip stamps the current second into its header, and the bytes name the
        # test, so pytest-xdist workers collecting a second apart saw different tests
        (gzip.compress(b'{"prompt": "a"}\n', mtime=0), r"is a gzip-compressed file, not JSON lines"),
        (b"PAR1\x15\x04", r"is a Parquet file"),
        ('{"prompt": "a"}\n'.encode("utf-16"), r"is UTF-16 text, not UTF-8"),
        (b'{"prompt": "a"}\n\x00\x01\x02', r":2: binary data \(NUL byte at offset 16\)"),
        (b'[{"prompt": "a"},\n {"prompt": "b"}]\n', r"is one JSON array, not JSON lines"),
    ],
    ids=["gzip", "parquet", "utf-16", "nul-byte", "json-array"],
)
def test_binary_and_near_miss_files(tmp_path, data, match):
    f = tmp_path / "odd.jsonl"
    f.write_bytes(data)
    with pytest.raises(InputError, match=match) as info:
        load_prompts(f)
    assert "odd.jsonl" in info.value.message and "\n" not in info.value.message
    assert info.value.hint


@pytest.mark.parametrize("content", ["", "\n\n   \n"])
def test_empty_file(tmp_path, content):
    f = tmp_path / "empty.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match="empty prompt set"):
        load_prompts(f)


# ---------------------------------------------------------------------------- select()


def make_set(spec: dict[str, int]) -> PromptSet:
    prompts = [
        Prompt(id=f"{d}-{i}", domain=d, category=d, turns=(f"{d} prompt {i}",))
        for d, n in spec.items()
        for i in range(n)
    ]
    return PromptSet.from_prompts("t", "t", prompts)


def test_select_round_robin_covers_every_domain():
    ps = make_set({"code": 4, "math": 1, "chat": 3})
    out = select(ps, max_prompts=5)
    # Round 1 takes one of each; round 2 skips the exhausted math; file order is kept.
    assert [p.id for p in out.prompts] == ["code-0", "code-1", "math-0", "chat-0", "chat-1"]
    assert out.domains == ["code", "math", "chat"]
    assert select(ps, max_prompts=2).domains == ["code", "math"]
    assert len(select(ps, max_prompts=100)) == 8
    # Deterministic: same input, same output, same hash.
    assert select(ps, max_prompts=5) == out


def test_select_builtin_small_n_covers_all_domains():
    out = select(builtin_suite(), max_prompts=6)
    assert out.domains == list(DOMAINS)


def test_select_domain_filter():
    ps = make_set({"code": 2, "math": 2, "chat": 2})
    out = select(ps, domains=["MATH", "coding"])
    assert [p.id for p in out.prompts] == ["code-0", "code-1", "math-0", "math-1"]
    out = select(ps, domains=["chat"], max_prompts=1)
    assert [p.id for p in out.prompts] == ["chat-0"]
    assert out.name == "t"
    assert out.sha256 != ps.sha256


def test_select_unknown_domain_names_available():
    ps = make_set({"code": 1, "math": 1})
    with pytest.raises(InputError, match=r"unknown domain poetry.*available: code, math"):
        select(ps, domains=["poetry"])
    with pytest.raises(InputError, match="available: code, math"):
        select(ps, domains=["code", "poetry"])
    with pytest.raises(InputError, match="available"):
        select(ps, domains=[])


@pytest.mark.parametrize("n", [0, -1])
def test_select_bad_max_prompts(n):
    with pytest.raises(InputError, match="positive integer"):
        select(make_set({"code": 1}), max_prompts=n)


# ---------------------------------------------------------------------------- sha256


def test_sha256_stable_and_content_sensitive(tmp_path):
    rows = [
        {"question_id": 1, "category": "writing", "turns": ["a", "b"]},
        {"question_id": 2, "category": "coding", "turns": ["c"], "reference": ["r"]},
    ]
    first = load_prompts(write_jsonl(tmp_path / "a.jsonl", rows))
    again = load_prompts(write_jsonl(tmp_path / "b.jsonl", rows))
    # Same content under another file name is the same experiment.
    assert first.sha256 == again.sha256
    assert len(first.sha256) == 64
    assert builtin_suite().sha256 == builtin_suite().sha256

    def changed(mutate) -> str:
        copy = json.loads(json.dumps(rows))
        mutate(copy)
        return load_prompts(write_jsonl(tmp_path / "c.jsonl", copy)).sha256

    assert changed(lambda r: r[0]["turns"].__setitem__(1, "B")) != first.sha256
    assert changed(lambda r: r[1].__setitem__("reference", ["other"])) != first.sha256
    assert changed(lambda r: r[1].__setitem__("question_id", 3)) != first.sha256
    assert changed(lambda r: r[0].__setitem__("category", "coding")) != first.sha256
    assert changed(lambda r: r.reverse()) != first.sha256


# ---------------------------------------------------------------------------- issue 21: a new user's files


def test_lone_surrogate_escape_is_one_line_naming_file_and_line(tmp_path):
    f = tmp_path / "s.jsonl"
    # written as the escape itself: json.dumps would write it the same way
    f.write_text('{"id":"ok","prompt":"fine \\ud83d\\ude00 pair"}\n{"id":"s","prompt":"bad \\ud800 surrogate"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"s\.jsonl:2: the prompt text holds a lone surrogate \\ud800") as info:
        load_prompts(f)
    assert "\n" not in info.value.one_line() and "pair" in info.value.hint
    # the same in a later turn or a reference names that field
    f.write_text('{"question_id": 1, "turns": ["a", "b \\udfff"]}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r":1: the turn 2 holds a lone surrogate \\udfff"):
        load_prompts(f)
    f.write_text('{"prompt": "a", "reference": "x\\ud800"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r":1: the reference holds"):
        load_prompts(f)


def _stdin(monkeypatch, data: bytes) -> None:
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_prompts_from_stdin(monkeypatch, tmp_path):
    rows = [{"question_id": 1, "category": "writing", "turns": ["a", "b"]}, {"prompt": "c", "domain": "code"}]
    data = ("\n".join(json.dumps(r) for r in rows) + "\n").encode()
    _stdin(monkeypatch, data)
    ps = load_prompts("-")
    assert (ps.name, ps.source, len(ps)) == ("stdin", "-", 2)
    # read once: a second load in the same run (the CLI checks the set first) gets the same set
    assert load_prompts("-") is ps
    # its identity is its content, as for a file with the same lines
    f = tmp_path / "same.jsonl"
    f.write_bytes(data)
    assert load_prompts(f).sha256 == ps.sha256
    _stdin(monkeypatch, b'{"prompt": "bad \\ud800"}\n')
    with pytest.raises(InputError, match=r"<stdin>:1: the prompt text holds a lone surrogate"):
        load_prompts("-")
    _stdin(monkeypatch, b"")
    with pytest.raises(InputError, match=r"<stdin>: empty prompt set"):
        load_prompts("-")


def test_diagnose_reads_prompts_from_stdin(tiny_pair, tmp_path):
    from typer.testing import CliRunner

    from specprobe.cli.main import app

    data = "".join(json.dumps({"id": f"p{i}", "prompt": " ".join(f"w{i + j}" for j in range(6)), "domain": "chat"}) + "\n" for i in range(3))
    res = CliRunner().invoke(app, [
        "diagnose", str(tiny_pair["target"]), "self:layers=1", "--prompts", "-", "--max-new-tokens", "4", "--cost-ratio", "0.2",
        "--max-prompts", "2", "--json", str(tmp_path / "r.json"),
    ], input=data)
    assert res.exit_code == 0, res.output
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["prompt_set"]["name"] == "stdin" and r["prompt_set"]["num_prompts"] == 2
    assert "prompts from stdin: 2 of 3 prompts" in " ".join(res.output.split())


def test_select_spec_bench_reaches_every_category_and_says_how(tmp_path):
    ps = load_prompts(DATA / "spec_bench_question.jsonl")
    # 13 of the file's prompts: one of each of its 13 categories, not 13 MT-Bench questions
    out = select(ps, max_prompts=13)
    assert sorted(p.category for p in out.prompts) == sorted(SPEC_BENCH_CATEGORIES)
    assert out.description == "13 of 16 prompts, round-robin over 13 categories"
    # fewer than the categories: still every domain, and not only MT-Bench's
    six = select(ps, max_prompts=6)
    assert set(six.domains) == set(DOMAINS)
    assert {spec_bench_task(p.category) for p in six.prompts} == {"mt_bench", "translation", "summarization"}
    assert [p.id for p in six.prompts] == [p.id for p in ps.prompts if p.id in {q.id for q in six.prompts}]  # file order
    # a Spec-Bench-sized file (80 per task, in task order): 13 of 480 reach math_reasoning and rag
    rows = []
    for task_i, (task, task_cats) in enumerate(SPEC_BENCH_TASKS.items()):
        for j in range(80):
            rows.append({"question_id": task_i * 80 + j + 1, "category": task_cats[j % len(task_cats)], "turns": [f"{task} {j}"]})
    big = load_prompts(write_jsonl(tmp_path / "question.jsonl", rows))
    out = select(big, max_prompts=13)
    assert {p.category for p in out.prompts} == set(SPEC_BENCH_CATEGORIES)
    assert out.description == "13 of 480 prompts, round-robin over 13 categories"
    assert select(big, domains=["math"], max_prompts=3).description == "3 of 480 prompts (domain math), round-robin over 3 categories"
    # a file without categories of its own: round-robin over domains, as before
    assert select(builtin_suite(), max_prompts=6).description == "6 of 60 prompts, round-robin over 6 domains"
    assert select(builtin_suite()).description == builtin_suite().description == "all 60 prompts"
