"""plot.py: the loss axis always holds every evaluation."""
import json

import pytest

pytest.importorskip("matplotlib")
import plot  # noqa: E402


def write_log(directory, losses):
    directory.mkdir()
    records = [{"kind": "config"}] + [{"kind": "eval", "iter": 100 * i, "train_time": 2.0 * i, "val_loss": v}
                                      for i, v in enumerate(losses)]
    (directory / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("losses", [[10.8, 7.2, 5.9, 4.1], [4.2, 2.5, 1.9], [1.5, 1.2], [3.3]],
                         ids=["bpe-above-3", "char", "low", "one-point"])
def test_loss_axis_contains_every_point(tmp_path, losses):
    write_log(tmp_path / "run", losses)
    fig = plot.draw({str(tmp_path / "run"): plot.read_evals(str(tmp_path / "run"))})
    bottom, top = fig.axes[0].get_ylim()
    assert bottom < min(losses) and max(losses) < top


@pytest.mark.parametrize("label", ["val loss", "val bits per byte"])
def test_axes_are_labelled_with_what_they_show(tmp_path, label):
    write_log(tmp_path / "run", [4.2, 2.5])
    fig = plot.draw({str(tmp_path / "run"): plot.read_evals(str(tmp_path / "run"))}, label=label)
    by_time, by_iter = fig.axes
    assert by_time.get_ylabel() == label and by_iter.get_xlabel() == "iterations"
    assert by_time.get_xlabel().startswith("training time, s")


def test_plot_writes_a_png(tmp_path):
    write_log(tmp_path / "a", [10.8, 6.0])
    write_log(tmp_path / "b", [10.9, 5.0])
    from conftest import run_script
    result = run_script(["plot.py", str(tmp_path / "a"), str(tmp_path / "b"), "--png", str(tmp_path / "x.png")])
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bpb_is_plotted_where_the_log_has_it(tmp_path):
    write_log(tmp_path / "run", [4.2, 2.0])
    with pytest.raises(plot.UserError, match="no evaluations with val_bpb"):
        plot.read_evals(str(tmp_path / "run"), "val_bpb")
    records = [{"kind": "config"}, {"kind": "eval", "iter": 0, "train_time": 0.0, "val_loss": 4.2, "val_bpb": 6.06}]
    (tmp_path / "run" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert plot.read_evals(str(tmp_path / "run"), "val_bpb") == [(0, 0.0, 6.06)]


def test_a_torn_line_is_skipped_with_a_note_and_a_record_appended_to_it_is_kept(tmp_path, capsys):
    """A log cut mid-line by a full disk, then appended to by the next run (whose header lands on the torn
    line): plot.py reads every whole record, says which line it skipped, and writes the figure."""
    write_log(tmp_path / "run", [4.2, 2.5])
    log = tmp_path / "run" / "log.jsonl"
    eval_record = {"kind": "eval", "iter": 300, "train_time": 9.0, "val_loss": 2.0}
    with open(log, "a") as f:
        f.write('{"kind": "eval", "iter": 200, "train_t')  # torn
        f.write(json.dumps({"kind": "config", "init_from": "scratch"}) + "\n" + json.dumps(eval_record) + "\n")
        f.write('{"kind": "eval", "iter": 400, "val_lo')  # torn again, at the end
    assert plot.read_evals(str(log.parent)) == [(300, 9.0, 2.0)]
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 2 and all("skipping a torn line" in n for n in notes) and f"{log}:4:" in notes[0]
    from conftest import run_script
    result = run_script(["plot.py", str(log.parent), "--png", str(tmp_path / "x.png")])
    assert result.returncode == 0 and "skipping a torn line" in result.stderr, result.stderr


def test_a_resumed_run_continues_its_figure_from_the_checkpoints_iter(tmp_path):
    """Interrupted after the eval at iter 300 but saved at 200 (the last improvement), then resumed: the
    figure holds the whole run, the resumed process's iter 300 in place of the first one's."""
    records = [{"kind": "config", "init_from": "scratch", "iter": 0}]
    records += [{"kind": "eval", "iter": i, "train_time": i / 100, "val_loss": 5 - i / 100} for i in (0, 100, 200, 300)]
    records += [{"kind": "config", "init_from": "resume", "iter": 200}]
    records += [{"kind": "eval", "iter": i, "train_time": i / 100 + 0.5, "val_loss": 4 - i / 1000} for i in (300, 400)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert plot.read_evals(str(tmp_path / "run")) == [(0, 0.0, 5.0), (100, 1.0, 4.0), (200, 2.0, 3.0),
                                                      (300, 3.5, 3.7), (400, 4.5, 3.6)]


def test_task_scores_are_drawn_below_the_loss_and_follow_a_resumed_run(tmp_path):
    """train.py's eval_tasks records ("tasks"): each task's acc against training time and iterations, in a
    row below the loss; a resumed process's scores replace those logged after its checkpoint's iter."""
    def tasks(i, t, acc):
        return {"kind": "tasks", "iter": i, "train_time": t, "seconds": 0.5, "tang/acc": acc, "tang/acc_stderr": 0.04,
                "tang/n": 100, "tang/acc_norm": acc - 0.01, "poem/acc": 1 - acc}
    records = [{"kind": "config", "init_from": "scratch", "iter": 0}]
    for i, acc in ((0, 0.25), (100, 0.3), (200, 0.35)):
        records += [{"kind": "eval", "iter": i, "train_time": i / 100, "val_loss": 5 - i / 100}, tasks(i, i / 100, acc)]
    records += [{"kind": "config", "init_from": "resume", "iter": 100}, tasks(200, 2.5, 0.4)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    scores = plot.read_tasks(str(tmp_path / "run"))
    assert scores == {"tang": [(0, 0.0, 0.25), (100, 1.0, 0.3), (200, 2.5, 0.4)],
                      "poem": [(0, 0.0, 0.75), (100, 1.0, 0.7), (200, 2.5, 0.6)]}
    assert plot.read_tasks(str(tmp_path / "run"), "acc_norm")["tang"][-1] == (200, 2.5, 0.39)
    run = str(tmp_path / "run")
    fig = plot.draw({run: plot.read_evals(run)}, tasks={run: scores})
    loss_time, loss_iter, task_time, task_iter = fig.axes
    assert task_iter.get_xlabel() == "iterations" and task_time.get_ylabel() == "acc (lm-eval tasks)"
    drawn = {line.get_label(): list(zip(line.get_xdata(), line.get_ydata())) for line in task_iter.get_lines()}
    assert drawn == {"run: tang": [(0, 0.25), (100, 0.3), (200, 0.4)], "run: poem": [(0, 0.75), (100, 0.7), (200, 0.6)]}
    assert [tuple(line.get_xdata()) for line in task_time.get_lines()][0] == (0.0, 1.0, 2.5)
    assert len(plot.draw({run: plot.read_evals(run)}, tasks={run: {}}).axes) == 2  # no tasks: no second row


def test_malformed_records_are_skipped_with_a_note_each_and_the_rest_drawn(tmp_path, capsys):
    """A line nested 100,000 deep (json.loads raises RecursionError), an eval without train_time, a string loss and
    an iter that is no number: each is one note naming its line, and plot.py draws the records around them."""
    write_log(tmp_path / "run", [4.2, 2.5])  # lines 1-3
    log = tmp_path / "run" / "log.jsonl"
    bad = ["[" * 100_000 + "]" * 100_000, {"kind": "eval", "iter": 300, "val_loss": 2.0},
           {"kind": "eval", "iter": 400, "train_time": 8.0, "val_loss": "2.0"},
           {"kind": "eval", "iter": "500", "train_time": 9.0, "val_loss": 1.9}]
    with open(log, "a") as f:
        for line in bad:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
        f.write(json.dumps({"kind": "eval", "iter": 600, "train_time": 12.0, "val_loss": 1.8}) + "\n")
    assert plot.read_evals(str(log.parent)) == [(0, 0.0, 4.2), (100, 2.0, 2.5), (600, 12.0, 1.8)]
    notes = capsys.readouterr().err.splitlines()
    assert [n.split(": ", 2)[1] for n in notes] == [f"{log}:{n}" for n in (4, 5, 6, 7)], notes
    assert "no train_time" in notes[1] and 'val_loss is "2.0", not a number' in notes[2] and "iter is" in notes[3]
    from conftest import run_script
    result = run_script(["plot.py", str(log.parent), "--png", str(tmp_path / "x.png")])
    assert result.returncode == 0 and result.stderr.splitlines() == notes, result.stderr
    assert (tmp_path / "x.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
