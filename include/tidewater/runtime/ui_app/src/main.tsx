// Tidewater inside Airflow's UI. Airflow's React plugin loader renders this component with the route's ids:
// no DAG (the "Tidewater" navigation page), a DAG (the "Tidewater" tab of a DAG), or a DAG run (its tab).
import { Box } from "@chakra-ui/react";

import { PipelinesPage } from "./pages/PipelinesPage";
import { PipelineTab } from "./pages/PipelineTab";
import { RunTab } from "./pages/RunTab";

type Props = { dagId?: string; runId?: string; taskId?: string; mapIndex?: string };

export default function TidewaterPlugin({ dagId, runId }: Props) {
  return (
    <Box p={4} data-testid="tidewater-app">
      {!dagId ? <PipelinesPage /> : runId ? <RunTab dagId={dagId} runId={runId} /> : <PipelineTab dagId={dagId} />}
    </Box>
  );
}
