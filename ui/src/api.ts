// The Tidewater API (FastAPI routes of tidewater.runtime.ui, behind Airflow's authentication) and Airflow's REST
// API for the actions (DAG runs), both called with the UI's own session.

export type Partition = { topic: string; partition: number; committed: number | null; end: number; lag: number };
export type Batch = {
  batch_id: string; snapshot_id: string; committed_at: string; records: number; rows: number; files: number;
  dead_letters: number; skipped: number; latency_s: number | null; data_docs: string | null;
  validation: { success: boolean; failed: number; checks: number } | null;
  changes: Record<string, number> | null;
};
export type LetterClass = { error_class: string; count: number };
export type Quarantined = { batch_id: string; table: string; rows: number; files: number;
  validation: { failed?: number; checks?: number } | null; decision_run_id: string };
export type Overview = {
  pipeline: string; dag_id: string; table: string; routed: boolean;
  status: { total_lag: number; valid_through: string | null; dead_letters: number; partitions: Partition[];
            problems?: string[]; waiting?: string[]; last_snapshot_id: string | null };
  freshness_s: number | null; batches: Batch[]; dead_letters: LetterClass[]; quarantined: Quarantined[];
  maintenance: { data_files: number; delete_files: number; snapshots: number; last_compaction: string | null } | null;
  audit: { clean: boolean; errors: number; at: string; first?: string[] } | null;
  letters: Record<string, number>;
};
export type PipelineRef = { name: string; dag_id: string; table: string; targets: string; dag_ids: string[];
  // null: the pipeline has no such DAG (airflow.dags, or no quarantine policy)
  replay_dag_id: string | null; skip_dag_id: string | null; quarantine_dag_id: string | null; retry_dag_id: string | null;
  freshness_deadline_s: number | null };
// one line of the navigation page and the dashboard panel (GET /tidewater/api/summaries): null where the
// pipeline's broker or catalog could not be read (``error`` says why)
export type Summary = { name: string; lag: number | null; partitions: number | null; freshness_s: number | null;
  audit: { clean: boolean; errors: number; at: string } | null; quarantined: number | null;
  open_dead_letters: number | null; problems: string[]; error: string | null; transient: boolean | null };
export type PipelinePage = { total: number; offset: number; limit: number;
  pipelines: { ref: PipelineRef; summary: Summary }[] };
export type Problem = { file: string; dag_id: string; error: string };
export type Letter = { topic: string; partition: number; offset: number; error_class: string; error_message: string;
  letter_batch_id: string; status: string; reason: string | null; action_id: string | null;
  payload_preview?: string | null; payload_bytes?: number; timestamp: string | null };
export type LagPoint = { at: string; batch_id: string; lag: number; capped: boolean };
export type RunDetail = {
  pipeline: string; run_id: string; found: boolean; batch_id?: string; kind?: string; snapshot_id?: string;
  ranges: { table: string; topic: string; partition: number; start_offset: number; end_offset: number; offsets: number }[];
  tables: { table: string; rows: number; snapshot_id: string; kind: string }[];
  records: number; rows: number; dead_letters: number; skipped: number;
  validation: { success: boolean; failed?: number; checks?: number } | null; data_docs: string | null;
  offsets: Record<string, Record<string, number>> | null;
};

export class ApiError extends Error {
  constructor(public status: number, message: string) { super(message); }
}

export const root = (path: string): string => new URL(path.replace(/^\//, ""), document.baseURI).toString();

export async function get<T>(path: string): Promise<T> {
  const r = await fetch(root(`tidewater/api/${path}`), { credentials: "same-origin" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body.detail || r.statusText);
  return body as T;
}

/** A call to Airflow's REST API with the UI's session: the JSON body, or null for a 404 when ``missingOk``. */
async function airflowApi(path: string, init: RequestInit = {}, missingOk = false): Promise<Record<string, unknown> | null> {
  const r = await fetch(root(`api/v2/${path}`), { credentials: "same-origin", ...init });
  if (missingOk && r.status === 404) return null;
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, typeof body.detail === "string" ? body.detail : r.statusText);
  return body as Record<string, unknown>;
}

/** A DAG run's state (Airflow's REST API), or null when the DAG has no run of that id. */
export async function runState(dagId: string, runId: string): Promise<string | null> {
  const run = await airflowApi(`dags/${encodeURIComponent(dagId)}/dagRuns/${encodeURIComponent(runId)}`, {}, true);
  return run === null ? null : (run.state as string);
}

/** Trigger a DAG run (Airflow's REST API): every action of the view is an audited run. */
export async function trigger(dagId: string, conf: Record<string, unknown>): Promise<string> {
  const run = await airflowApi(`dags/${encodeURIComponent(dagId)}/dagRuns`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ logical_date: null, conf }),
  });
  return run!.dag_run_id as string;
}
