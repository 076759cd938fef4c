"""The code that runs inside Serve's replicas: the ingress and backend deployments, their
builders, and the load board they report to (see `serve`'s docstring).

Must not: change Serve's state (the control plane does, through `serve.control`).
"""
