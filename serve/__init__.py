"""The serving plane, split by where the code runs (docs/serving.md):

- `serve.app`: the code inside Serve's replicas: the ingress and backend deployments
  (`ingress`, `backend`), their builders (`build`, the import paths Serve's config names) and
  the load board they report to (`load`);
- `serve.control`: the control plane's writer to Serve: `client` (the only module that calls
  Serve's controller), `operations` (deploy, scale a pool, set route weights, move replicas
  make-before-break), `waiting` (whether Serve shows what they wrote; waiting for it),
  `status` (what runs where, as a table);
- `serve.edge`: the serve endpoint in front of Serve's proxies: HAProxy, its configuration
  rendered by the product (`config`, `k8s`), run by `process`;
- shared by all three, pure: `config` (the `serving` schema), `spec` (the apps' names and
  routes; desired state <-> Serve app configs), `routing` (weighted pool choice, retries),
  `inputs` (request parsing and the error vocabulary), and `sample_model` (the default model,
  a model like a user's own).

Must not: import `controlplane` (an import-linter contract forbids it); `serve.app` imports
neither `serve.control` nor `serve.edge`, and `serve.edge` neither of the others (another
contract). Importing this package does not import Ray; the modules that need it import it
themselves.
"""
