"""The catalog's schema, versioned: Alembic migrations, run in place.

A writer that opens a catalog (:func:`..store.open_store`, under the writer's lease)
brings it to this release's schema: a new catalog is built by the migrations in
:mod:`.versions`, from the first; an older one (a catalog of release 0.1, schema
version 1, which knew no Alembic, is stamped as revision ``0001`` first) is upgraded by
the ones it lacks, in one transaction (on PostgreSQL, whose DDL is transactional, all
or nothing); a newer one is refused in one line. Readers never migrate: an older
catalog gets them one line naming ``snakemake-context upgrade``. Every migration
also writes the schema's number to ``catalog_meta``, so that releases before Alembic
refuse a catalog they cannot read in one line, as they always did.

- :mod:`.runner`: what a catalog's revision is, and the upgrade;
- :mod:`.env`: Alembic's environment script, which runs the migrations on the
  connection, and in the transaction, the runner hands it;
- :mod:`.versions`: the migrations, one module each.
"""
