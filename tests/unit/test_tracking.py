"""What the trackers record of a run's settings (observe.tracking): every setting a run can
have becomes a hyperparameter TensorBoard and MLflow take, a table (``model_kwargs``) as its
JSON text; the settings that only say how the run is watched are left out."""
from __future__ import annotations

import json

from mnistflow.training.config import TrainConfig, to_dict
from mnistflow.training.observe.tensorboard import TensorBoardLogger
from mnistflow.training.observe.tracking import epoch_scalars, eval_scalars, hparams, step_scalars


def test_a_table_setting_is_its_json_text_and_watching_settings_are_left_out(tmp_path):
    config = to_dict(TrainConfig(model="mnistflow.models.zoo:MLP", model_kwargs={"width": 64, "depth": 2},
                                 run_dir=str(tmp_path / "run"), mlflow="http://127.0.0.1:5000"))
    hp = hparams(config)
    assert hp["model_kwargs"] == json.dumps({"depth": 2, "width": 64})
    assert hp["batch_size"] == config["batch_size"] and hp["model"] == "mnistflow.models.zoo:MLP"
    assert not {"run_dir", "mlflow", "quiet", "json", "tensorboard", "resume"} & hp.keys()
    assert all(v is not None for v in hp.values())
    # TensorBoard takes them as the session's start (it raises on a dict)
    tb = TensorBoardLogger(tmp_path / "tb")
    tb.on_train_start({"config": config})
    tb.close()


def test_the_tags_of_each_event():
    step = {"loss": 0.5, "acc": 0.9, "lr": 0.1, "img_per_s": 1e5, "data_wait_frac": 0.1,
            "queue_depth": 2, "epoch": 0.5, "rss_mb": 400.0, "mine": 3, "flag": True}
    assert step_scalars(step) == {"train/loss": 0.5, "train/acc": 0.9, "lr": 0.1, "throughput/img_per_s": 1e5,
                                  "pipeline/data_wait_frac": 0.1, "pipeline/queue_depth": 2, "mine": 3}
    val = {"split": "val", "acc": 0.9, "loss": 0.3, "n": 100, "eval_s": 0.1, "val_acc": 0.9,
           "val_loss": 0.3, "best": 0.95}
    assert eval_scalars(val) == {"val/loss": 0.3, "val/acc": 0.9, "best": 0.95}
    # the epoch's own figures are curves already: only what a hook returned
    assert epoch_scalars({"epoch": 0, "step": 10, "loss": 0.4, "acc": 0.8, "val_loss": 0.3,
                          "val_acc": 0.9, "ema": 0.7}) == {"ema": 0.7}
