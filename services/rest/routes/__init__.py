"""Where each area of the HTTP API registers its routes: one module per area, one list
each, so that a path's handler is found in one place (services/rest/app.py adds them).

- jobs.py: every `/api/v2/jobs` route, PAI's and OpenPAI's;
- cluster.py: the cluster as OpenPAI shows it: VCs, sku types, `/info`, the banner and
  the Kubernetes views;
- market.py: the marketplace, `/api/v2/marketplace` (services/rest/market).

The identity routes are listed in services/rest/identity/routes.py (and the OpenPAI edit
routes beside them, identity/openpai.py, in its `routes`); the others (nodes, alerts,
rules, events, portal) in their own modules' `routes`.
"""
