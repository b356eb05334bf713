from helix.calibration import calibrate, parse_folder
from helix.models import MODEL_CATALOG


def test_folder_names():
    assert parse_folder("l4x2")[0].name == "L4" and parse_folder("l4x2")[1] == 2
    assert parse_folder("a100")[0].name == "A100-40G"


def test_analytic_model_matches_measured_profiles(shared_data):
    """The documented target: median relative error <= 25 % per GPU kind on the measured grid."""
    rows = calibrate(MODEL_CATALOG["llama-1-30b"], shared_data / "profiles" / "llama1-30b")
    assert {r.folder for r in rows} >= {"a100", "l4", "t4", "v100", "l4x2", "t4x2", "t4x4"}
    for row in rows:
        assert row.points > 50
        assert row.median_error <= 0.25, row
        assert row.worst_error < 1.0, row
