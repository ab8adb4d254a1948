"""loss.png (kiln.report.run.loss_figure) at the default's size: every legend inside its axes, the
cooldown marked in every panel."""

from __future__ import annotations

import math

from kiln.report.run import loss_figure, plot_loss


def records(steps: int = 1500, cooldown_from: int = 1050) -> list[dict]:
    """A wsd run's metrics.jsonl: log steps every 10, a validation every 100."""
    rows = []
    for s in range(10, steps + 1, 10):
        lr = 0.016 if s < cooldown_from else 0.016 * (1 - math.sqrt((s - cooldown_from) / (steps - cooldown_from)))
        rows.append({"step": s, "loss": 2 + 4 * math.exp(-s / 200), "lr": lr, "tokens_per_s": 17_900.0, "tflops": 0.1})
        if s % 100 == 0:
            rows.append({"step": s, "val_loss": 2.1 + 4 * math.exp(-s / 200)})
    return rows


def test_the_legends_sit_inside_their_axes_and_the_cooldown_is_marked(tmp_path):
    # the README run's labels (eval.reference is not drawn: kiln.report.run.loss_figure)
    fig = loss_figure(records(), unigram=6.2, bits_per_nat=0.45, cooldown_from=1050)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    loss_axes = fig.axes[0]
    legend = loss_axes.get_legend()
    inside = loss_axes.get_window_extent(renderer)
    box = legend.get_window_extent(renderer)
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
    assert "cooldown begins" in [t.get_text() for t in legend.get_texts()]
    for axes in fig.axes[:4]:  # loss, LR, tokens/s, MFU: a vertical line at the cooldown's step
        assert any(list(line.get_xdata()) == [1050, 1050] for line in axes.get_lines())
    plot_loss(records(), tmp_path / "loss.png", cooldown_from=None)
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_the_in_loop_evals_pass_at_1_gets_a_panel_at_its_steps():
    rows = records(steps=400, cooldown_from=300)
    for row in rows:
        if "val_loss" in row and row["step"] % 200 == 0:
            row["humaneval_pass@1"] = row["step"] / 4000
    fig = loss_figure(rows, cooldown_from=300)
    assert len(fig.axes) == 5 and fig.axes[1].get_ylabel() == "HumanEval\npass@1 (%)"
    (line, cooldown) = fig.axes[1].get_lines()
    assert list(line.get_xdata()) == [200, 400] and list(line.get_ydata()) == [5.0, 10.0]
    assert list(cooldown.get_xdata()) == [300, 300]
    assert len(loss_figure(records()).axes) == 4  # without it, as before
