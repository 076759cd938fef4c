"""The control plane's writer to Serve: `client` calls Serve's controller (and nothing else
does), `operations` are the primitives the control loop's actuators apply, `waiting` judges
whether Serve shows what they wrote (and waits for it), `status` reads what runs where (see
`serve`'s docstring).

Must not: run inside a replica (that is `serve.app`), or decide anything (the policies do).
"""
