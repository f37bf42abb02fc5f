"""benchmarks/shared.py's pieces on cases whose answer is known."""

import json
import math
import threading

import pytest
import torch

import benchmarks.shared as shared
from benchmarks.shared import (api_settings, best_seconds, closed_loop, final_eval, in_turns, mean_std, print_rows,
    quartiles, table)
from inference.engine import Engine
from model.config import GPTConfig
from model.gpt import GPT


def test_turns_timings_and_their_statistics(monkeypatch):
    order = []
    seconds = in_turns({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=2, warmup=1)
    assert order == ["a", "b"] * 3
    assert {name: len(spent) for name, spent in seconds.items()} == {"a": 2, "b": 2}
    assert all(s >= 0 for spent in seconds.values() for s in spent)
    # The best of timings is the fastest, and the device is waited for around each.
    clock = iter([0.0, 5.0, 10.0, 12.0, 20.0, 23.0])  # three timings: 5, 2 and 3 seconds
    monkeypatch.setattr(shared.time, "perf_counter", lambda: next(clock))
    events = []
    assert best_seconds(lambda: events.append("call"), 3, sync=lambda: events.append("sync")) == 2.0
    assert events == ["sync", "call", "sync"] * 3
    # Quartiles, and the mean with its spread.
    assert quartiles([7, 1, 3, 5, 9, 2, 8, 4]) == (3, 5, 8)  # by rank: the 3rd, 5th and 7th of eight
    assert quartiles([4.0]) == (4.0, 4.0, 4.0)
    mean, std = mean_std([1.0, 2.0, 3.0])
    assert mean == 2.0 and std == pytest.approx(1.0)
    assert math.isnan(mean_std([5.0])[1])


def test_tables_json_lines_and_the_final_score(capsys, tmp_path):
    assert table(("name", "kind", "n"), [("a", "x", 1)], left=2) == "| name | kind | n |\n|---|---|---:|\n| a | x | 1 |"
    rows = [({"seed": 1, "score": 0.5}, (1, "0.500")), ({"seed": 2, "score": 0.25}, (2, "0.250"))]
    print_rows(("seed", "score"), iter(rows), as_json=False, left=0)
    assert capsys.readouterr().out == "| seed | score |\n|---:|---:|\n| 1 | 0.500 |\n| 2 | 0.250 |\n"
    print_rows(("seed", "score"), iter(rows), as_json=True)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [r for r, _ in rows]
    print_rows(("seed", "score"), iter([]), as_json=False)  # nothing measured: no empty table
    assert capsys.readouterr().out == ""
    # The final score is the last final evaluation, and none before it.
    assert final_eval(tmp_path) is None  # no metrics file
    records = [{"kind": "eval", "step": 5, "val_bpb": 3.0}, {"kind": "final_eval", "step": 5, "val_bpb": 3.1},
               {"kind": "final_eval", "step": 9, "val_bpb": 2.5}]  # a run resumed after its first end
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records[:1]))
    assert final_eval(tmp_path) is None  # begun, not finished
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    assert final_eval(tmp_path) == (9, 2.5)


@pytest.fixture(scope="module")
def engine_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=32, n_layer=1, n_head=2, n_kv_head=1, n_embd=32)).eval()


def test_closed_loop_clients_send_each_request_after_the_last_one_finished(engine_model):
    turns = {0: 3, 1: 1, 2: 2}  # requests per client
    sent: dict[int, list[int]] = {client: [] for client in turns}
    finished: dict[int, list[int]] = {client: [] for client in turns}
    in_flight: set[int] = set()
    lock = threading.Lock()

    def next_request(client, finish):
        with lock:
            if finish is not None:
                in_flight.remove(client)
                finished[client].append(finish.completion_tokens)
            if len(sent[client]) == turns[client]:
                return None
            assert client not in in_flight, "a client sent again before its request finished"
            in_flight.add(client)
            sent[client].append(len(sent[client]))
        return [1, 2, 3], api_settings(4 + client, seed=client), ()

    with Engine(engine_model, max_batch=2) as engine:
        timings, seconds = closed_loop(engine, len(turns), next_request)
    assert finished == {client: [4 + client] * count for client, count in turns.items()}
    assert len(timings) == sum(turns.values()) and seconds > 0 and not in_flight
    assert sorted(t.tokens for t in timings) == sorted(4 + c for c, count in turns.items() for _ in range(count))
    assert all(len(t.stamps) == t.tokens and t.stamps[0] >= t.submitted for t in timings)
    # A client that fails on the engine's thread fails the loop instead of hanging.
    def next_request(client, finish):
        if finish is not None:
            raise RuntimeError("the client's own bug")
        return [1, 2], api_settings(2), ()

    with Engine(engine_model, max_batch=2) as engine:
        with pytest.raises(RuntimeError, match="the client's own bug"):
            closed_loop(engine, 2, next_request)
