"""``mnistflow export RUN --format web``: the model as a static page that runs it in a browser.

``trace`` records the model's forward as a small graph (``graph``, ``ops``); ``run`` runs that
graph in PyTorch (the export's check against the model); ``folder`` writes the page: its files,
the graph and the weights in ``model.js``. The browser's forward pass is
``server/static/web/forward.js``. docs/web.md is the user's guide.
"""
