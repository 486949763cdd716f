// The "Tidewater" tab of a DAG: the pipeline the DAG belongs to (its ingest, replay, skip, retry, quarantine, audit or
// maintenance DAG), in detail; other DAGs say they are not Tidewater's.
import { Button, Stack, Text } from "@chakra-ui/react";
import { useState } from "react";

import { get, type PipelineRef } from "../api";
import { Loading, useLoad } from "../parts";
import { PipelineDetail } from "./PipelineDetail";

export function usePipelineOf(dagId: string) {
  return useLoad(async () => (await get<PipelineRef[]>("pipelines")).find((p) => p.dag_ids.includes(dagId)) ?? null,
    [dagId]);
}

export function PipelineTab({ dagId }: { dagId: string }) {
  const [nonce, setNonce] = useState(0);
  const ref = usePipelineOf(dagId);
  if (ref.data === undefined) return <Loading error={ref.error} what="the pipelines" />;
  if (ref.data === null) return <Text color="fg.muted" id="not-tidewater">{dagId} is not a DAG of a Tidewater pipeline you may read.</Text>;
  return (
    <Stack gap={2}>
      <Button id="refresh" size="sm" variant="outline" alignSelf="start" onClick={() => setNonce((n) => n + 1)}>Refresh</Button>
      <PipelineDetail pipeline={ref.data} nonce={nonce} />
    </Stack>
  );
}
