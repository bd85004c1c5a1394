"""What training and deployment share to turn observations into executed actions: the per-env chunk timeline
(docs/design.md §5) and the batching inference server. Both `acce/runtime` (rollout workers, evaluator) and
`robot_bridge` (executor, policy host) import from here, so the deploy side never imports the training runtime."""
