// One pipeline as an operator looks at it (the DAG tab and the navigation page): lag per partition and over time,
// freshness, the last audit, the last batches, dead letters (by class, browsable, retried through the retry DAG),
// quarantined batches (Publish / Drop through the quarantine DAG), maintenance, and the replay and skip forms.
import { Box, HStack, Link, Stack, Text } from "@chakra-ui/react";

import { get, runState, type LagPoint, type Overview, type PipelineRef } from "../api";
import { DocsLink, LagChart, Loading, Rows, RunButton, Section, Verdict, airflowLink, useLoad } from "../parts";
import { DeadLetters } from "./DeadLetters";

export function PipelineDetail({ pipeline, nonce }: { pipeline: PipelineRef; nonce?: number }) {
  const name = encodeURIComponent(pipeline.name);
  const o = useLoad(() => get<Overview>(`pipelines/${name}`), [name, nonce]);
  const lag = useLoad(() => get<LagPoint[]>(`pipelines/${name}/lag-history`), [name, nonce]);
  if (!o.data) return <Loading error={o.error} what={pipeline.name} />;
  const v = o.data, st = v.status;
  return (
    <Stack gap={1} data-testid="pipeline-detail" data-pipeline={v.pipeline}>
      <HStack gap={6} wrap="wrap">
        <Text>table <b>{v.table}</b></Text>
        <Text>total lag <b id="total-lag">{st.total_lag}</b> records</Text>
        <Text>freshness <b id="freshness">{v.freshness_s === null ? "-" : `${v.freshness_s} s`}</b></Text>
        <Text>valid through <b>{st.valid_through || "-"}</b></Text>
        <Text>dead letters <b id="open-letters">{v.letters.open}</b> open of <b>{v.letters.total}</b></Text>
        <Text id="audit">audit {v.audit ? <><Verdict ok={v.audit.clean} yes="clean" no={`${v.audit.errors} discrepancies`} />
          <Text as="span" color="fg.muted" fontSize="sm"> {v.audit.at}</Text></> : "never"}</Text>
      </HStack>
      {(v.audit?.first || []).concat(st.problems || []).map((p) => <Text key={p} color="fg.error">{p}</Text>)}
      {(st.waiting || []).map((w) => <Text key={w} color="fg.warning" className="waiting">{w}</Text>)}

      <Section title="Partitions">
        <Rows head={["topic", "partition", "committed", "end", "lag"]} rows={st.partitions.map((p) =>
          [p.topic, p.partition, p.committed ?? "-", p.end, <span className="lag">{p.lag}</span>])} />
      </Section>
      <Section title="Lag over time">
        {lag.data ? <LagChart points={lag.data} now={st.total_lag} /> : <Loading error={lag.error} what="the ledger" />}
      </Section>
      <Section title="Last batches">
        <Rows head={["batch", "committed", "records", "rows", "files", "dead letters", "skipped", "validation", "latency s"]}
          rows={v.batches.map((b) => [b.batch_id, b.committed_at, b.records,
            b.changes ? `${b.rows} (${b.changes.inserted ?? 0} inserted, ${b.changes.updated ?? 0} updated, ${b.changes.deleted ?? 0} deleted)` : b.rows,
            b.files, b.dead_letters, b.skipped,
            <>{b.validation ? <Verdict ok={b.validation.success} yes="passed" no="failed" /> : "-"} <DocsLink page={b.data_docs} /></>,
            b.latency_s ?? "-"])} />
      </Section>
      <Section title="Dead letters">
        <DeadLetters pipeline={pipeline} classes={v.dead_letters} counts={v.letters} />
      </Section>
      <Section title="Quarantined batches">
        <Rows head={["batch", "table", "rows", "files", "validation", "decision", ""]} rows={v.quarantined.map((q) => [
          q.batch_id, q.table, q.rows, q.files,
          q.validation ? `${q.validation.failed ?? "?"} of ${q.validation.checks ?? "?"} checks failed` : "-",
          pipeline.quarantine_dag_id ? <Decision dagId={pipeline.quarantine_dag_id} runId={q.decision_run_id} nonce={nonce} /> : "-",
          <HStack>{pipeline.quarantine_dag_id && (["publish", "drop"] as const).map((action) =>
            <RunButton key={action} label={action === "publish" ? "Publish" : "Drop"} dagId={pipeline.quarantine_dag_id!}
              className="quarantine" action={action} resultId="quarantine-run"
              conf={{ action, batch_id: q.batch_id, ...(v.routed ? { table: q.table } : {}) }} />)}</HStack>])} />
        {v.quarantined.length ? <Text fontSize="sm" color="fg.muted">Publish appends the batch to main once; Drop
          discards it. Each is a run of {pipeline.quarantine_dag_id}, recorded with who asked. The decision is the
          batch's question in Airflow's Required actions, where Airflow 3.1+ asks it; when its run failed, decide here.
          </Text> : null}
      </Section>
      <Section title="Maintenance">
        {v.maintenance ? <Rows head={["data files", "delete files", "snapshots", "last compaction"]}
          rows={[[v.maintenance.data_files, v.maintenance.delete_files, v.maintenance.snapshots,
            v.maintenance.last_compaction || "never"]]} /> : <Text color="fg.muted">no table yet</Text>}
      </Section>
      <Box mt={4}>
        <HStack gap={4}>
          <Link colorPalette="blue" href={airflowLink(`dags/${v.dag_id}`)}>ingest DAG</Link>
          {pipeline.replay_dag_id ? <Link colorPalette="blue" id="replay-link"
            href={airflowLink(`dags/${pipeline.replay_dag_id}`)}>replay a range</Link> : null}
          {pipeline.skip_dag_id ? <Link colorPalette="blue" href={airflowLink(`dags/${pipeline.skip_dag_id}`)}>skip
            blocking records</Link> : null}
          {pipeline.retry_dag_id ? <Link colorPalette="blue" href={airflowLink(`dags/${pipeline.retry_dag_id}`)}>dead-letter
            retries</Link> : null}
        </HStack>
      </Box>
    </Stack>
  );
}

/** The decision run a quarantined batch opened (``decision_run_id``, a run of the quarantine DAG, Airflow 3.1+): open
 * in Required actions (a link to it) until applied, answered, or failed (Airflow lost the answer after its retries:
 * decide with the buttons beside it); "-" where there is none (older Airflow, or a batch committed outside Airflow). */
function Decision({ dagId, runId, nonce }: { dagId: string; runId: string; nonce?: number }) {
  const s = useLoad(() => runState(dagId, runId), [dagId, runId, nonce]);
  if (s.error) return <Text as="span" color="fg.muted" className="decision" data-state="unknown">?</Text>;
  if (s.data === undefined) return <Loading what="the decision" />;
  if (s.data === null) return <span className="decision" data-state="none">-</span>;
  const text = s.data === "failed" ? "failed: decide here" : s.data === "success" ? "answered" : "open in Required actions";
  return <Link href={airflowLink(`dags/${dagId}/runs/${runId}/tasks/decide/required_actions`)} className="decision"
    data-state={s.data} colorPalette={s.data === "failed" ? "red" : "blue"}>{text}</Link>;
}
