// The "Tidewater" page of Airflow's navigation: the pipelines the user may read, a page at a time (lag, freshness, the
// last audit's verdict, quarantined batches), then one pipeline in detail.
import { Button, HStack, NativeSelect, Stack, Text } from "@chakra-ui/react";
import { useState } from "react";

import { Loading, Pager, Problems, Rows, Section, Verdict, usePipelinePage } from "../parts";
import { PipelineDetail } from "./PipelineDetail";

export function PipelinesPage() {
  const [nonce, setNonce] = useState(0);
  const [offset, setOffset] = useState(0);
  const [chosen, setChosen] = useState<string>("");
  const page = usePipelinePage(nonce, offset);
  if (!page.data) return <Loading error={page.error} what="the pipelines" />;
  const listed = page.data.pipelines;
  if (!listed.length) return <Stack><Text color="fg.muted">no pipelines</Text><Problems id="problems" nonce={nonce} /></Stack>;
  const current = (listed.find((p) => p.ref.name === chosen) ?? listed[0]).ref;
  return (
    <Stack gap={2}>
      <Section title="Tidewater pipelines">
        <Rows id="pipelines" rowClass="pipeline" head={["pipeline", "targets", "lag", "freshness s", "audit", "quarantined"]}
          rows={listed.map(({ ref, summary: s }) => [ref.name, ref.targets, s.lag ?? "?", s.freshness_s ?? "-",
            s.audit ? <Verdict ok={s.audit.clean} yes="clean" no={`${s.audit.errors} discrepancies`} /> : (s.error ? "?" : "never"),
            s.quarantined ?? "?"])} />
        <Pager page={page.data} onOffset={setOffset} />
        <Problems id="problems" nonce={nonce} />
      </Section>
      <HStack mt={4}>
        <NativeSelect.Root size="sm" width="24rem">
          <NativeSelect.Field id="pipeline" value={current.name} onChange={(e) => setChosen(e.currentTarget.value)}>
            {listed.map(({ ref }) => <option key={ref.name} value={ref.name}>{`${ref.name} -> ${ref.targets}`}</option>)}
          </NativeSelect.Field>
        </NativeSelect.Root>
        <Button id="refresh" size="sm" variant="outline" onClick={() => setNonce((n) => n + 1)}>Refresh</Button>
      </HStack>
      <PipelineDetail key={current.name} pipeline={current} nonce={nonce} />
    </Stack>
  );
}
