// The "Tidewater" page of Airflow's navigation: every pipeline the user may read (lag, freshness, the last audit's
// verdict, quarantined batches), then one pipeline in detail.
import { Button, HStack, NativeSelect, Stack, Text } from "@chakra-ui/react";
import { useState } from "react";

import { Loading, Problems, Rows, Section, Verdict, usePipelineOverviews } from "../parts";
import { PipelineDetail } from "./PipelineDetail";

export function PipelinesPage() {
  const [nonce, setNonce] = useState(0);
  const [chosen, setChosen] = useState<string>("");
  const list = usePipelineOverviews(nonce);
  if (!list.data) return <Loading error={list.error} what="the pipelines" />;
  if (!list.data.length) return <Stack><Text color="fg.muted">no pipelines</Text><Problems id="problems" nonce={nonce} /></Stack>;
  const name = chosen || list.data[0].ref.name;
  const current = list.data.find((p) => p.ref.name === name)?.ref;
  return (
    <Stack gap={2}>
      <Section title="Tidewater pipelines">
        <Rows id="pipelines" rowClass="pipeline" head={["pipeline", "targets", "lag", "freshness s", "audit", "quarantined"]}
          rows={list.data.map(({ ref, o }) => [ref.name, ref.targets, o ? o.status.total_lag : "?",
            o?.freshness_s ?? "-", o?.audit ? <Verdict ok={o.audit.clean} yes="clean" no={`${o.audit.errors} discrepancies`} /> : "never",
            o ? o.quarantined.length : "?"])} />
        <Problems id="problems" nonce={nonce} />
      </Section>
      <HStack mt={4}>
        <NativeSelect.Root size="sm" width="24rem">
          <NativeSelect.Field id="pipeline" value={name} onChange={(e) => setChosen(e.currentTarget.value)}>
            {list.data.map(({ ref }) => <option key={ref.name} value={ref.name}>{`${ref.name} -> ${ref.targets}`}</option>)}
          </NativeSelect.Field>
        </NativeSelect.Root>
        <Button id="refresh" size="sm" variant="outline" onClick={() => setNonce((n) => n + 1)}>Refresh</Button>
      </HStack>
      {current ? <PipelineDetail key={current.name} pipeline={current} nonce={nonce} /> : null}
    </Stack>
  );
}
