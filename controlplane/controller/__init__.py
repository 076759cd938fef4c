"""The controller: the shell that runs the control loop with its store, API and adapters:
`actor` (the detached ``rcp-controller`` actor and `deploy(cfg)`, local mode) and `in_process`
(the same controller in the calling Ray driver: the head pod on Kubernetes).

Must not: decide (the loop's policies do); it wires, starts and stops.
"""
