// One UMD bundle for Airflow's React plugin loader: it imports the file and takes the component from
// globalThis.AirflowPlugin. React, its JSX runtime and Chakra UI are Airflow's own (it exposes them as globals),
// so the apps share the UI's React and theme (dark mode included) and the bundle stays small.
import { resolve } from "node:path";
import { defineConfig } from "vite";

export default defineConfig({
  build: {
    outDir: resolve(__dirname, "../include/tidewater/runtime/ui_static"),
    emptyOutDir: true,
    lib: {
      entry: resolve(__dirname, "src/main.tsx"),
      name: "AirflowPlugin",
      formats: ["umd"],
      fileName: () => "tidewater-ui.js",
    },
    rollupOptions: {
      external: ["react", "react/jsx-runtime", "@chakra-ui/react"],
      output: {
        globals: { react: "React", "react/jsx-runtime": "ReactJSXRuntime", "@chakra-ui/react": "ChakraUI" },
      },
    },
  },
});
