"""The nightly: the run over every stage, why a row runs again (`why`), the CI shards (`plan`, `report merge`), the
run's summary, and the release watch."""
