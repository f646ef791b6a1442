"""Whether a model's RidgeFill split was measured, in the words the RidgeFill panel, `chat` and the server's
/v1/models use: "untuned: split S is a guess …" until a tuned record exists (backend/ridgefill/tuned.py),
and a tuned record that chose exact said plainly. Qt-free: the server and the commands use it too."""
from __future__ import annotations

from backend.errors import ModelFileError
from backend.model_file import read_model_header
from backend.ridgefill.defaults import MEASURED_SPLITS, guess_note, split_is_guess
from backend.ridgefill.tuned import read_tuned, summary


def untuned_note(info) -> str:
    """The guess note while this model's split is a guess (no tuned record, not in the measured table); ""
    once it was measured. `info`: a ModelInfo (reads the tuned record beside the maps)."""
    return guess_note(info) if split_is_guess(info) else ""


def untuned_note_of_file(model_path: str | None) -> str:
    """untuned_note of the model file at `model_path` (its header: milliseconds); "" for a file that cannot
    be read (whoever runs it says why)."""
    if not model_path:
        return ""
    try:
        return untuned_note(read_model_header(model_path))
    except ModelFileError:
        return ""


def untuned_note_of_ready(ready) -> str:
    """untuned_note from an EngineReady, without the disk: its tuned line is "" exactly when the engine
    found no record as it started."""
    key = (ready.architecture, ready.n_layer, ready.n_embd)
    return "" if ready.tuned or key in MEASURED_SPLITS else guess_note(ready)


def tuned_line(record: dict | None) -> str:
    """The RidgeFill panel's line for a tuned record (that tune chose exact, where it did); "" for none."""
    return summary(record)


def model_tuning(info) -> tuple[str, str]:
    """(the tuned line, the untuned note) of a ModelInfo."""
    return tuned_line(read_tuned(info)), untuned_note(info)
