"""The production Serve application: an HTTP ingress on the head routing each request by
weight to one backend deployment per (model, pool), and the primitives the control plane
uses to scale pools, set route weights and move replicas make-before-break.

Modules: `config` (schema), `spec` (desired state <-> Serve app configs, pure), `routing` and
`inputs` (pure request decisions), `ingress` and `backend` (the deployments), `app` (their
builders), `control` (the only module calling Serve's controller), `operations` (deploy,
scale_pool, set_route_weights, move), `status` (serve_status, format_status_table),
`sample_model` (the default model).

Must not: import `controlplane` (an import-linter contract forbids it). Importing this
package does not import Ray; the modules that need it import it themselves.
"""
