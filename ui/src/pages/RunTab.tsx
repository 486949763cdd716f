// The "Tidewater batch" tab of a DAG run: what that run's batch read and committed, per partition and per table.
import { HStack, Stack, Text } from "@chakra-ui/react";

import { get, type RunDetail } from "../api";
import { DocsLink, Loading, Rows, Section, Verdict, useLoad } from "../parts";
import { usePipelineOf } from "./PipelineTab";

export function RunTab({ dagId, runId }: { dagId: string; runId: string }) {
  const ref = usePipelineOf(dagId);
  const name = ref.data ? encodeURIComponent(ref.data.name) : null;
  const run = useLoad(async () => name ? get<RunDetail>(`pipelines/${name}/runs/${encodeURIComponent(runId)}`) : null,
    [name, runId]);
  if (ref.data === undefined) return <Loading error={ref.error} what="the pipelines" />;
  if (ref.data === null) return <Text color="fg.muted" id="not-tidewater">{dagId} is not a DAG of a Tidewater pipeline you may read.</Text>;
  if (!run.data) return <Loading error={run.error} what={`run ${runId}`} />;
  const r = run.data;
  if (!r.found) return <Text color="fg.muted" id="no-batch">This run committed no batch of {r.pipeline} (yet): it was
    caught up, still running, or failed before its commit.</Text>;
  return (
    <Stack gap={1} data-testid="run-detail">
      <HStack gap={6} wrap="wrap">
        <Text>batch <b id="run-batch">{r.batch_id}</b> ({r.kind})</Text>
        <Text>snapshot <b id="run-snapshot">{r.snapshot_id}</b></Text>
        <Text>records <b id="run-records">{r.records}</b></Text>
        <Text>rows <b id="run-rows">{r.rows}</b></Text>
        <Text>dead letters <b id="run-dead-letters">{r.dead_letters}</b></Text>
        <Text>skipped <b id="run-skipped">{r.skipped}</b></Text>
        <Text id="run-gate">gate {r.validation ? <Verdict ok={r.validation.success} yes="passed" no="failed" /> : "-"} <DocsLink page={r.data_docs} /></Text>
      </HStack>
      <Section title="Ranges">
        <Rows id="run-ranges" rowClass="range" head={["table", "topic", "partition", "from", "to (exclusive)", "offsets"]}
          rows={r.ranges.map((x) => [x.table, x.topic, x.partition, x.start_offset, x.end_offset, x.offsets])} />
      </Section>
      {r.tables.length > 1 ? <Section title="Tables">
        <Rows head={["table", "kind", "rows", "snapshot"]} rows={r.tables.map((t) => [t.table, t.kind, t.rows, t.snapshot_id])} />
      </Section> : null}
      <Section title="Offsets after the batch">
        <Rows id="run-offsets" head={["topic", "partition", "next offset"]} rows={Object.entries(r.offsets || {}).flatMap(
          ([topic, parts]) => Object.entries(parts).map(([p, o]) => [topic, p, o]))} />
      </Section>
    </Stack>
  );
}
