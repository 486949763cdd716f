// Tidewater inside Airflow's UI. Airflow's React plugin loader renders this component with the route's ids:
// no DAG (the "Tidewater" navigation page, or the panel of the dashboard on Airflow's home page), a DAG (the
// "Tidewater" tab of a DAG), or a DAG run (its tab).
import { Box } from "@chakra-ui/react";

import { DashboardPanel } from "./pages/DashboardPanel";
import { PipelinesPage } from "./pages/PipelinesPage";
import { PipelineTab } from "./pages/PipelineTab";
import { RunTab } from "./pages/RunTab";

type Props = { dagId?: string; runId?: string; taskId?: string; mapIndex?: string };

/** Airflow gives an app no sign of where it is shown but the route: its navigation page is `plugin/<url_route>`
 * under the UI's base URL, the dashboard is the home page. */
const onDashboard = () => !window.location.pathname.slice(new URL(document.baseURI).pathname.length).startsWith("plugin/");

export default function TidewaterPlugin({ dagId, runId }: Props) {
  if (!dagId && onDashboard()) return <Box data-testid="tidewater-dashboard"><DashboardPanel /></Box>;
  return (
    <Box p={4} data-testid="tidewater-app">
      {!dagId ? <PipelinesPage /> : runId ? <RunTab dagId={dagId} runId={runId} /> : <PipelineTab dagId={dagId} />}
    </Box>
  );
}
