"""Alembic's environment for the history database: always run from
`services.rest.history.store.migrate`, which hands over its open connection (inside
its transaction); there is no alembic.ini and no offline mode."""

from alembic import context

from services.rest.history.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
