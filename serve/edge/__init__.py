"""The serve endpoint: HAProxy, configured by the product, in front of the Serve proxies.

Modules: `config` (the settings and the rendered ``haproxy.cfg``, pure), `process` (the binary,
writing, checking and running it), and ``rcp_edge.lua`` (the route-table task HAProxy runs:
it loads the ingress's weights into the map the frontend routes predicts by).

Must not: import Ray or `controlplane`.
"""
