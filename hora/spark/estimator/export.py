"""The final model, for inference outside Spark, under `<store>/runs/<run_id>/model/`:

state_dict.pt   torch.save(model.state_dict()): load into your own class
model.pkl       the whole module, cloudpickled (needs its class importable, or defined in
                the script that pickled it)
model.pt2       a torch.export program (torch.export.load), when the model can be exported
"""

from __future__ import annotations

import io
from typing import Any

import cloudpickle

from hora.spark.estimator.store import MODEL
from hora.storage import Location
from hora.wire.link import log_to_driver


def export_model(model: Any, example: list[Any] | None, run: Location) -> list[str]:
    """Write the files above; the names written (model.pt2 is left out when export fails)."""
    import torch

    model = model.to("cpu").eval()
    written = []
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    run.write_bytes(f"{MODEL}/state_dict.pt", buffer.getvalue())
    written.append("state_dict.pt")
    run.write_bytes(f"{MODEL}/model.pkl", cloudpickle.dumps(model))
    written.append("model.pkl")
    if example is not None:
        try:
            program = _export(model, tuple(t.to("cpu") for t in example))
            buffer = io.BytesIO()
            torch.export.save(program, buffer)
        except Exception as e:  # not every model exports; the other two files are enough
            log_to_driver(f"hora: no model.pt2 for this model (torch.export: {type(e).__name__})")
        else:
            run.write_bytes(f"{MODEL}/model.pt2", buffer.getvalue())
            written.append("model.pt2")
    return written


def _export(model: Any, example: tuple[Any, ...]) -> Any:
    """torch.export with the batch dimension left free, or fixed when the model needs that."""
    import torch

    batch = {0: torch.export.Dim.AUTO}
    try:
        return torch.export.export(model, example, dynamic_shapes=tuple(batch for _ in example))
    except Exception:
        return torch.export.export(model, example)
