#!/usr/bin/env bash
# `make demo`: embedded broker -> pizza events -> ingest DAG through Airflow (twice) -> what landed.
# Run by the Makefile, which sets TIDEWATER_HOME, AIRFLOW_HOME and PATH. Safe to run again.
set -euo pipefail
PIPELINE=include/pipelines/pizzas.yaml
PORT=${PORT:-19092}
LOG_DIR="$TIDEWATER_HOME/demo-logs"
mkdir -p "$LOG_DIR"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Embedded Kafka broker on 127.0.0.1:$PORT"
if tidewater broker status >/dev/null 2>&1; then
  tidewater broker status
else
  tidewater broker start --port "$PORT"
  # A new in-memory broker has none of the records an earlier demo table recorded offsets for.
  python - <<'PY'
from tidewater.table.catalog import load_catalog
from tidewater.config.parse import load_pipeline
spec = load_pipeline("include/pipelines/pizzas.yaml")
catalog = load_catalog(spec)
if catalog.table_exists(spec.table.identifier):
    catalog.purge_table(spec.table.identifier)
    print(f"dropped {spec.table.identifier} from an earlier demo (its broker is gone)")
PY
fi

airflow dags reserialize >"$LOG_DIR/reserialize.log" 2>&1

run_dag() {
  local log="$LOG_DIR/ingest_pizzas-$(date +%s).log"
  echo "airflow dags test ingest_pizzas   (log: $log)"
  if ! airflow dags test ingest_pizzas >"$log" 2>&1 || ! grep -q "state=success" "$log"; then
    echo "the DAG run failed; last lines of $log:"; tail -40 "$log"; exit 1
  fi
  { grep -oE "batch [0-9A-Za-z-]+ committed to [a-z_.]+: snapshot [0-9]+, [0-9]+ records, [0-9]+ files|Skipping downstream tasks" "$log" || true; } | sed -n 1p
}

SEED=$(date +%s)
step "Produce 3000 completed-pizza events (Scenario 1) to completed-pizzas, 6 partitions"
tidewater produce-sample --bootstrap "127.0.0.1:$PORT" --count 3000 --seed "$SEED"

step "Run the ingest DAG through Airflow: plan -> write (spark-submit) -> validate -> commit"
run_dag

step "Produce 1500 more events, run the DAG again"
tidewater produce-sample --bootstrap "127.0.0.1:$PORT" --count 1500 --seed "$((SEED + 1))"
run_dag

step "Lag and committed offsets (tidewater status)"
tidewater status --pipeline "$PIPELINE"

step "Snapshot history with the offsets stamped on each commit (tidewater history)"
tidewater history --pipeline "$PIPELINE"

step "Top-producing stores, by Spark SQL on the same catalog"
tidewater sql --pipeline "$PIPELINE" \
  "SELECT store_id, count(*) AS pizzas FROM rpc.pizzas GROUP BY store_id ORDER BY pizzas DESC, store_id LIMIT 10" 2>/dev/null | grep -v " WARN "

step "Run the maintenance DAG: compact, rewrite manifests, expire snapshots, remove orphan files"
log="$LOG_DIR/maintain_pizzas-$(date +%s).log"
echo "airflow dags test maintain_pizzas   (log: $log)"
if ! airflow dags test maintain_pizzas >"$log" 2>&1 || ! grep -q "state=success" "$log"; then
  echo "the maintenance DAG failed; last lines of $log:"; tail -40 "$log"; exit 1
fi
grep -oE "(rewrite_data_files|rewrite_manifests|expire_snapshots|remove_orphan_files) on [a-z_.]+: data files [0-9]+ -> [0-9]+, bytes [0-9,]+ -> [0-9,]+, manifests [0-9]+ -> [0-9]+, snapshots [0-9]+ -> [0-9]+" "$log" | awk '!seen[$1]++' || true
echo "The committed offsets are unchanged (read from the newest snapshot that carries them):"
tidewater status --pipeline "$PIPELINE" | sed -n 1,3p  # sed reads to the end: no broken pipe

step "Done"
echo "Airflow UI on the same set-up: make ui     Stop the broker: make broker-stop"
