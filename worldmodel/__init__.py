"""The learned world model (docs/design.md §7): model, offline pretraining, online trainer, ImaginedEnv, evaluation.

Nothing is imported here so that `import worldmodel` stays light; torch loads with `worldmodel.model`. Entry points:
`worldmodel.model.WorldModel`, `worldmodel.imagined_env.ImaginedEnv`, `worldmodel.trainer.WorldModelTrainer`,
`worldmodel.pretrain.pretrain`, `worldmodel.evaluate.wm_eval`, `worldmodel.cli.add_parsers` (acce wm-pretrain/wm-eval).
"""
